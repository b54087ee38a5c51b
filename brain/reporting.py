"""Telling the owner what happened: a run's outcome (``announce_outcome``: its reply or
notice to the device that spoke, ``timeline.new`` to the others), and the truth about tool
results, the three exits of one set of facts:

1. activity cards, whose status comes straight from receipts (``unknown`` and
   ``waiting`` included), pushed to the owner's devices;
2. the text given back to the model after a call: the normalized receipt plus only the
   facts not yet delivered to the owner, in the model's wording (which may say what to do
   next: "do not repeat", "check with X before retrying");
3. the follow-up reply: the model's draft checked by the deterministic checker against
   the task's receipts, missing facts added from templates, stored once, delivered in
   chunks; its facts count as told when a device ACKs the reply.

Cards and replies carry only the owner's wording of facts (``truth.Fact.text``); the
report prompt lists the same, so what the model may state is what a person may read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from channels.db import database_sync_to_async

from brain.models import AgentTask, Run
from brain.prompts import OWNER_SYSTEM
from brain.services import store_reply_once
from capabilities import services, truth
from capabilities.client import ToolOutcome
from capabilities.models import ReceiptRecord, ToolCall
from llm import roles
from llm.client import BrainError, complete
from llm.usage import CallContext
from memory.models import TimelineEntry
from yimi_project import push
from yimi_project.errors import YimiError
from yimi_project.ids import uuid_or_nil
from yimi_project.logs import log_event

CHUNK_CHARS = 24

# What Yimi says when the owner says no to a card, by the category of what it asked about
# (a payment card is ``spend``): the owner's words were heard, and nothing was done.
DECLINED_ACKS = {
    "send": "好，不发了。",
    "spend": "好，不付了。",
    "delete": "好，不删了。",
    "owner_data": "好，不改了。",
    "account": "好，账号先不动。",
    "physical": "好，先不动它。",
}
DECLINED_ACK = "好，不做了。"


def declined_ack(category: str) -> str:
    """The acknowledgement of a denied card whose action is of ``category``."""
    return DECLINED_ACKS.get(category, DECLINED_ACK)


def tool_label(tool: str) -> str:
    return tool.replace("__", " ")


async def push_receipt_card(owner_id: int, task: AgentTask, outcome: ToolOutcome) -> None:
    card = truth.activity_card(str(task.id), task.goal[:120], outcome.receipt or {})
    await push.to_owner(owner_id, {"type": "activity", **card})


async def push_task_card(owner_id: int, task: AgentTask, state: str) -> None:
    """The final card of a task: its status is its last receipt's, if it has any."""
    last = await database_sync_to_async(
        lambda: ReceiptRecord.objects.filter(call__agent_id=str(task.id)).order_by("-created_at").first()
    )()
    if last is not None:
        card = truth.activity_card(str(task.id), task.goal[:120], last.receipt)
        await push.to_owner(owner_id, {"type": "activity", **card})


def _facts_for(records: list[ReceiptRecord]) -> list[truth.Fact]:
    facts: list[truth.Fact] = []
    for record in records:
        facts.extend(truth.render_facts(record.receipt, tool_label=tool_label(record.call.tool), key=f"{record.task_id}:{record.revision}"))
    return facts


async def model_text(owner_id: int, outcome: ToolOutcome) -> str:
    """The receipt and the facts about it the owner has not been told yet, in the model's
    wording (a fact only the model reads is never told, so it is always here)."""

    def build() -> str:
        record = ReceiptRecord.objects.select_related("call").filter(call_id=uuid_or_nil(outcome.call_id)).order_by("-revision").first()
        facts = _facts_for([record]) if record is not None else []
        delivered = services.delivered_fact_ids(owner_id, [f.id for f in facts]) if facts else set()  # none to ask about
        new = [f.model_text for f in facts if f.id not in delivered]
        return json.dumps({"receipt": outcome.receipt, "facts_not_yet_told": new}, ensure_ascii=False)

    return await database_sync_to_async(build)()


@dataclass
class Report:
    prompt: str
    receipts: list[dict[str, Any]] = field(default_factory=list)
    facts: list[truth.Fact] = field(default_factory=list)
    delivered: set[str] = field(default_factory=set)
    # What the owner said in this exchange: her words quoted back in the reply are not
    # checked as the model's claims (``truth.check_reply``'s ``owner_words``).
    owner_words: list[str] = field(default_factory=list)


def _task_records(task: AgentTask) -> list[ReceiptRecord]:
    agent_ids = [str(task.id), *(str(i) for i in AgentTask.objects.filter(parent=task).values_list("id", flat=True))]
    call_ids = list(ToolCall.objects.filter(agent_id__in=agent_ids).values_list("id", flat=True))
    task_ids = list(ReceiptRecord.objects.filter(call_id__in=call_ids, written_by_gateway=False).values_list("task_id", flat=True))
    current = services.current_receipts(task_ids)
    return sorted(current.values(), key=lambda r: r.created_at)


async def prepare_report(task: AgentTask) -> Report:
    def build() -> Report:
        fresh = AgentTask.objects.get(id=task.id)
        records = [ReceiptRecord.objects.select_related("call").get(pk=r.pk) for r in _task_records(fresh)]
        lines = [
            "[Background task finished — report to the owner briefly.]",
            f"Goal: {fresh.goal}",
            f"Sub-agent state: {fresh.state}; its summary: {fresh.result}",
        ]
        if fresh.steer_pending:
            lines.append("Owner additions that did not reach the task in time: " + "; ".join(fresh.steer_pending))
        report = report_for_records(records, task.run.owner_id, lines)
        if task.run.scope == "owner":  # the request the task came from, and what she added while it ran
            report.owner_words = [task.run.inbound.text, *(str(a) for a in [*fresh.steer_delivered, *fresh.steer_pending])]
        return report

    return await database_sync_to_async(build)()


async def report_turn(run: Any, report: Report, claim: Callable[[int], bool], *, context: list[dict[str, Any]] | None = None, event: str) -> None:
    """One report turn: the model (the ``brain`` role pinned on the run, ``roles.for_run``)
    drafts from the report's prompt (after ``context``), the draft is checked and delivered
    once (``claim``). If the model call fails or the settings cannot be used, the facts are
    told from templates alone."""
    messages = [{"role": "system", "content": OWNER_SYSTEM}, *(context or []), {"role": "user", "content": report.prompt}]
    try:
        role_settings = (await database_sync_to_async(roles.for_run)(run.id)).brain
        draft = (await complete(messages, role_settings=role_settings, usage_for=CallContext(run.id))).text
    except (BrainError, YimiError) as exc:
        log_event("report_turn_failed", about=event, error_code=exc.code)
        draft = ""
    await deliver_checked_reply(run, report, draft, claim)


async def deliver_checked_reply(run: Any, report: Report, draft: str, claim: Callable[[int], bool]) -> None:
    """Check a draft against the receipts, store it at most once (``claim``), deliver it in
    chunks to the device that spoke, and remember which facts it carried."""
    checked = truth.check_reply(draft, receipts=report.receipts, delivered_fact_ids=report.delivered, facts=report.facts,
                                owner_words=report.owner_words)
    text = checked.text.strip() or "这件事结束了，但我没有可以确认的结果。"
    await deliver_reply(run, text, claim, told=list(checked.told))


async def deliver_reply(run: Any, text: str, claim: Callable[[int], bool], *, told: list[str] | None = None) -> bool:
    """Store ``text`` as a reply to the run's utterance at most once (``claim``), remember
    the facts it carries (``told``, when it carries any) and deliver it in chunks to the
    device that spoke, then ``timeline.new`` to the owner's other devices. False: the event
    was already reported, nothing was stored or sent. A checked report and a platform
    acknowledgement (a denied card) take this same path."""
    entry = await database_sync_to_async(store_reply_once)(run, text, claim)
    if entry is None:
        return False  # already reported
    if told is not None:
        await database_sync_to_async(services.facts_carried)(run.owner_id, entry.id, told)
    chunks = push.ReplyChunks(run.origin_device_id, {"run_id": str(run.id), "reply_to_seq": run.inbound.seq})
    for i in range(0, len(text), CHUNK_CHARS):
        await chunks.add(text[i : i + CHUNK_CHARS])
    done = {"type": "reply.done", "run_id": str(run.id), "reply_to_seq": run.inbound.seq, "seq": entry.seq, "text": text}
    await push.to_device_then_owner(
        run.origin_device_id, done, run.owner_id, push.timeline_new(entry.seq, known_to_device=run.origin_device_id),
        before=await chunks.last(),
    )
    return True


def report_for_records(records: list[ReceiptRecord], owner_id: int, header: list[str]) -> Report:
    facts = _facts_for(records)
    delivered = services.delivered_fact_ids(owner_id, [f.id for f in facts]) if facts else set()  # none to ask about
    new = [f.text for f in facts if f.for_owner and f.id not in delivered]
    lines = [*header, "Facts from receipts (only these may be stated; they will be checked): " + (" ".join(new) or "none")]
    return Report("\n".join(lines), [r.receipt for r in records], facts, delivered)


async def announce_outcome(run: Run, entry: TimelineEntry, *, told: bool = True, last_chunk: dict[str, Any] | None = None) -> None:
    """Deliver a run's outcome (its reply, or its notice) to the origin device and tell the
    other devices to sync: at the end of a run (``brain.runner``), or when the recovery
    sweep expires a run too old to answer (``brain.recovery``).
    ``told``: the reply carried facts (``facts_carried``); without, the ACK has no ledger
    to close (``ledgers``, read by the consumer, not sent). ``last_chunk``: the reply's
    last ``reply.chunk`` (``ReplyChunks.last``), sent ahead of the outcome in its message."""
    if entry.kind == TimelineEntry.Kind.REPLY:
        frame = {"type": "reply.done", "run_id": str(run.id), "reply_to_seq": run.inbound.seq, "seq": entry.seq, "text": entry.text,
                 "ledgers": told}
    else:
        frame = {
            "type": "notice",
            "run_id": str(run.id),
            "reply_to_seq": run.inbound.seq,
            "seq": entry.seq,
            "code": entry.notice_code,
            "text": entry.text,
        }
    await push.to_device_then_owner(
        run.origin_device_id, frame, run.owner_id, push.timeline_new(entry.seq, known_to_device=run.origin_device_id),
        before=last_chunk,
    )
