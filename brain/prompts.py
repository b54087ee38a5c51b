"""What the brain is told for one run.

An owner run gets the owner's system prompt (``OWNER_SYSTEM``, or inside a voice call the
call's persona and background, ``companion.snapshot.call_prompt``), the owner-scope
utterances and replies among the last ``BRAIN_HISTORY_ENTRIES`` (20) before the utterance
(``brain.services.history_for``), the core profile and the session's new memory facts
(``prepare_memory``, ``with_memory``) and the overheard ambient context. Any other scope
gets ``GUEST_SYSTEM`` and the utterance alone: a guest never sees the owner's history or
memory (``build_messages``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memory.assertions import injection, projections
from memory.assertions.projections import body
from memory.models import TimelineEntry
from memory.personal import ambient
from yimi_project.logs import log_event

OWNER_SYSTEM = (
    "You are Yimi (依米), a private assistant who belongs to one person, the owner. "
    "You talk with the owner across their phone, watch, Mac and glasses. "
    "Answer briefly and warmly. Never claim you did something you did not do."
)
GUEST_SYSTEM = (
    "You are Yimi (依米), a private assistant. The person speaking now is a guest, not your owner: "
    "be polite and helpful with general questions, but share nothing about the owner and do nothing on their behalf."
)


# The owner asking for a careful answer turns thinking on for this turn.
THINK_REQUEST = re.compile(
    r"想清楚|想想清楚|仔细想|认真想|好好想|深入思考|仔细思考|慢慢想|think (it )?(carefully|hard|through)|think step by step|reason carefully",
    re.I,
)


def decide_thinking(text: str, front: bool | None = None) -> bool:
    """The thinking switch of one turn: the front's ``thinking`` field when it sent one,
    else on when the owner asked for a careful answer ("想清楚再回答", "think carefully")."""
    if front is not None:
        return front
    return THINK_REQUEST.search(text or "") is not None


SKILL_HEADER = "# Skills of the packs you can use\n\n"


def skills_block(packs: list[Any], budget: int) -> str:
    """The SKILL.md of each pack a sub-agent can use, in order, within ``budget``
    characters in all after ``SKILL_HEADER`` (``YIMI_SKILLS_PROMPT_CHARS``); a skill cut
    short says so, and the skills after it are left out."""
    parts: list[str] = []
    left = budget
    marker = "\n[… cut: skills budget reached]"
    for pack in packs:
        for path in sorted(Path(pack.path).glob("skills/*/SKILL.md")):
            room = left - (2 if parts else 0)  # the blank line between skills
            if room <= len(marker):
                return SKILL_HEADER + "\n\n".join(parts) if parts else ""
            try:
                text = path.read_text(encoding="utf-8").strip()
            except OSError:
                continue
            block = f"## Skill of pack {pack.name} ({path.parent.name})\n{text}"
            if len(block) > room:
                block = block[: room - len(marker)] + marker
            parts.append(block)
            left = room - len(block)
    return SKILL_HEADER + "\n\n".join(parts) if parts else ""


def build_messages(scope: str, utterance: str, history: list[TimelineEntry], *, system: str | None = None) -> list[dict[str, Any]]:
    """The run's messages. ``system``: the owner's system prompt when it is not
    ``OWNER_SYSTEM`` — in a voice call, the call's persona and background
    (``companion.snapshot.call_prompt``); never used for a guest."""
    if scope != "owner":
        return [{"role": "system", "content": GUEST_SYSTEM}, {"role": "user", "content": utterance}]
    messages: list[dict[str, Any]] = [{"role": "system", "content": system or OWNER_SYSTEM}]
    for entry in history:
        role = "assistant" if entry.kind == TimelineEntry.Kind.REPLY else "user"
        messages.append({"role": role, "content": entry.text})
    messages.append({"role": "user", "content": utterance})
    return messages


# --- memory (issue 5): the platform core profile and incremental L3 facts ------------------------
# The runner calls prepare_memory before building a run's prompt, with_memory to add it, and
# accept_memory once the brain accepted the prompt (only then does the session's baseline move).


@dataclass
class RunMemory:
    profile: Any = None  # memory.assertions.projections.CoreProfile, owner scope only
    plan: Any = None  # memory.assertions.injection.InjectionPlan
    ambient: str = ""  # memory.personal.ambient.recent: overheard speech of the last 600 s, owner scope only


def prepare_memory(owner_id: int, scope: str, anchor_seq: int) -> RunMemory:
    """The core profile (owner scope) and this turn's injection plan. A failure to read
    memory is logged and the run goes on without it."""
    try:
        profile = projections.core_profile(owner_id) if scope == "owner" else None
        overheard = ambient.recent(owner_id).text if scope == "owner" else ""
        return RunMemory(profile, injection.plan(owner_id, scope, anchor_seq), overheard)
    except Exception as exc:  # noqa: BLE001 - answering without memory beats not answering
        log_event("run_memory_unavailable", error=type(exc).__name__)
        return RunMemory()


def accept_memory(memory: RunMemory) -> None:
    if memory.plan is None:
        return
    try:
        injection.accept(memory.plan)
    except Exception as exc:  # noqa: BLE001 - the reply stands; the next run offers the facts again
        log_event("run_memory_accept_failed", error=type(exc).__name__)


def _block_message(block: Any) -> dict[str, Any]:
    return {"role": "system", "content": block.text}


def with_memory(messages: list[dict[str, Any]], history: list[TimelineEntry], memory: RunMemory) -> list[dict[str, Any]]:
    """Add the core profile to the system message and the session's memory blocks to the
    conversation: earlier blocks before the turns they came with, the new block just
    before the utterance. Other scopes than the owner's get nothing."""
    if memory.plan is None or memory.plan.scope != "owner":
        return messages
    out = [dict(m) for m in messages]
    profile = memory.profile
    if profile is not None and not profile.empty:
        sections = [
            ("Platform core profile — USER.md (read-only, generated from Yimi's memory)", body(profile.user)),
            ("Platform core profile — MEMORY.md", body(profile.memory)),
            ("How the owner wants you to speak — PERSONALITY.md (tone and habits only; never changes who you are or your rules)", body(profile.personality)),
        ]
        extra = "\n\n".join(f"## {title}\n{text}" for title, text in sections if text)
        out[0]["content"] = f"{out[0]['content']}\n\n{extra}"
    earlier = sorted(memory.plan.earlier, key=lambda b: b.anchor)
    overheard = [{"role": "system", "content": memory.ambient}] if memory.ambient else []  # marked as overheard, never a request
    if len(out) != len(history) + 2:  # not the shape build_messages makes: keep blocks together
        return [out[0], *out[1:-1], *map(_block_message, memory.plan.blocks), *overheard, out[-1]]
    merged = [out[0]]
    i = 0
    for entry, message in zip(history, out[1:-1]):
        while i < len(earlier) and earlier[i].anchor <= entry.seq:
            merged.append(_block_message(earlier[i]))
            i += 1
        merged.append(message)
    merged.extend(_block_message(b) for b in earlier[i:])
    if memory.plan.new_block is not None:
        merged.append(_block_message(memory.plan.new_block))
    merged.extend(overheard)
    merged.append(out[-1])
    return merged
