"""What the brain is told for one run."""

from __future__ import annotations

from typing import Any

from memory.models import TimelineEntry

OWNER_SYSTEM = (
    "You are Yimi (依米), a private assistant who belongs to one person, the owner. "
    "You talk with the owner across their phone, watch, Mac and glasses. "
    "Answer briefly and warmly. Never claim you did something you did not do."
)
GUEST_SYSTEM = (
    "You are Yimi (依米), a private assistant. The person speaking now is a guest, not your owner: "
    "be polite and helpful with general questions, but share nothing about the owner and do nothing on their behalf."
)


def build_messages(scope: str, utterance: str, history: list[TimelineEntry]) -> list[dict[str, Any]]:
    if scope != "owner":
        return [{"role": "system", "content": GUEST_SYSTEM}, {"role": "user", "content": utterance}]
    messages: list[dict[str, Any]] = [{"role": "system", "content": OWNER_SYSTEM}]
    for entry in history:
        role = "assistant" if entry.kind == TimelineEntry.Kind.REPLY else "user"
        messages.append({"role": role, "content": entry.text})
    messages.append({"role": "user", "content": utterance})
    return messages
