"""Executing one run: claim it, ask the brain, stream the reply to the device that spoke.

Async so that the same code runs inside a Celery worker (``asyncio.run``) and, in the
embedded default without a broker, on the web server's own event loop.

Steps: 1. claim the run (compare-and-set; a run someone else holds is left alone);
2. a run whose utterance is older than 3 minutes is expired with a notice, never
answered late; 3. the main agent's turn (``agent_loop.main_turn``): its text is buffered
to each sentence end, checked by the deterministic checker against the receipts of this
run's tree (``CheckedStream``: unbacked status words, numbers not in receipts and
internal markers are removed) and only then sent to the origin device as
``reply.chunk`` frames, batched by time (``push.ReplyChunks``: the first at once, then at
most one per 20 ms, so one frame may carry several sentences), while a heartbeat task
keeps the claim alive; any delegation creates sub-agent tasks; 4. store exactly the text
the device received in the timeline, send ``reply.done`` with its sequence number, tell
the owner's other devices there is something new to sync, then start the delegated tasks.
Any failure of the model call ends in an honest ``notice`` entry instead of a reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import connection

from brain import agent_loop, queries, reporting, services, trace, vision
from brain.agent_loop import DELEGATED_ACK, main_turn
from brain.dispatch import dispatch_task, keep_claim
from brain.models import Run
from brain.prompts import accept_memory, build_messages, decide_thinking, prepare_memory, with_memory
from capabilities import services as capability_services
from capabilities import truth
from capabilities.models import ReceiptRecord
from companion import snapshot as call_snapshot
from llm import roles, usage
from llm.client import BrainError
from memory.models import TimelineEntry
from yimi_project import push
from yimi_project.errors import YimiError
from yimi_project.infra import statements
from yimi_project.leaks import redact_markers
from yimi_project.logs import log_event

# Said instead when the checker removed every sentence of a main reply that delegated nothing.
NOTHING_BACKED = "这件事我还没有去办，也没有可以确认的结果。"


def _system_text_patterns() -> tuple[re.Pattern[str], ...]:
    """The platform's own sentences that ``main_turn`` streams after the model's text (the
    delegation acknowledgement, "not started"): worded by the system, not the model, so they
    pass unchecked (internal markers still redacted)."""
    out = [re.compile(re.escape(DELEGATED_ACK)), re.compile(re.escape(vision.NOT_CONFIGURED))]
    not_started = getattr(agent_loop, "NOT_STARTED", None)
    if isinstance(not_started, str):
        out.append(re.compile(".+".join(re.escape(part) for part in re.split(r"\{\w*\}", not_started)), re.S))
    return tuple(out)


SYSTEM_TEXTS = _system_text_patterns()


def run_tree_report(run: Run, *, pack_results: bool = True) -> reporting.Report:
    """The receipts of this run's whole delegation tree (current revisions, pack results
    only) with their facts and which of them the owner has already been told.
    ``pack_results=False``: the caller has just read that the tree has none (the claim)."""
    task_ids: list[str] = []
    if pack_results and not statements.on_postgresql():  # SQLite takes the ORM
        task_ids = list(ReceiptRecord.objects.filter(call__run_id=run.id, written_by_gateway=False).values_list("task_id", flat=True))
    elif pack_results:  # before every checked reply: built once (brain.queries.receipt_tasks_sql)
        sql, params, fields = queries.receipt_tasks_sql()
        key = Run._meta.pk.get_db_prep_value(run.id, connection)  # type: ignore[union-attr]
        task_ids = [task_id for task_id, in statements.fetch(sql, [key, *params], fields)]
    current = capability_services.current_receipts(task_ids) if task_ids else {}  # a run without pack results: none
    records = sorted(current.values(), key=lambda r: r.created_at)
    records = [ReceiptRecord.objects.select_related("call").get(pk=r.pk) for r in records]
    return reporting.report_for_records(records, run.owner_id, [])


class CheckedStream:
    """The main agent's text on its way to the device: buffered to each sentence end
    (``truth.split_sentences``), checked (``truth.ReplyCheck``, the same rules as
    ``check_reply``), and only what survives is sent, sentence by sentence (``send``
    batches them by time into ``reply.chunk`` frames). The first chunk leaves as soon as
    the first sentence is complete.

    ``text`` is exactly what was sent: the caller stores it. With ``checked=False`` (the
    benchmark's unchecked path, ``YIMI_BENCH_UNCHECKED_REPLIES``) deltas go out as they come.
    """

    def __init__(self, send: Callable[[str], Awaitable[None]], check: truth.ReplyCheck | None) -> None:
        self.send = send
        self.check = check
        self.buffer = ""
        self.raw = ""
        self.text = ""

    async def _out(self, piece: str) -> None:
        if piece:
            self.text += piece
            await self.send(piece)

    async def __call__(self, delta: str) -> None:
        self.raw += delta
        if self.check is None:
            await self._out(delta)
            return
        if any(rx.fullmatch(delta) for rx in SYSTEM_TEXTS):  # the system's own sentence: flush, then send as is
            for sentence in truth.split_sentences(self.buffer):
                await self._out(self.check.feed(sentence))
            self.buffer = ""
            await self._out(self.check.system(redact_markers(delta)))
            return
        self.buffer += delta
        pieces = truth.split_sentences(self.buffer)
        for sentence in pieces[:-1]:  # the last piece may still grow (more text, closing marks)
            await self._out(self.check.feed(sentence))
        self.buffer = pieces[-1] if pieces else ""

    async def close(self, *, fallback: str) -> str:
        """Check the rest, add the facts not yet told, and send ``fallback`` if nothing
        survived. Returns the whole text sent."""
        if self.check is None:
            self.text = self.text.strip()
            return self.text
        for sentence in truth.split_sentences(self.buffer):
            await self._out(self.check.feed(sentence))
        self.buffer = ""
        await self._out(self.check.finish())
        if not self.text.strip():
            await self._out(redact_markers(fallback))
        if self.check.removed:
            log_event("reply_sentences_removed", reasons=[reason for _, reason in self.check.removed])
        return self.text


@dataclass
class _Turn:
    """What the turn needs besides the prompt, read in the claim's trip: the run's model
    roles (pinned now; or the ``YimiError`` that makes them unusable, raised in the turn as
    a failed brain call), the image a vision request is about, and for the main turn the
    owner's background tasks and the thinking switch."""

    models: roles.RunRoles | YimiError
    image: Any = None
    active: list[Any] | None = None
    thinking: bool | None = None


def _claim_and_prepare(run_id: Any, stages: dict[str, float] | None) -> tuple[Run, Any, Any, Any, _Turn | None] | None:
    """Steps 1-2 and everything the turn reads before the brain request, in one trip to the
    database thread (each trip costs a thread hop and a pool checkout; the trace showed
    them): claim the run (None: not ours); a stale run comes back with no messages; else
    its history and prompt, the memory hook (issue 5: core profile + incremental L3 facts,
    ``brain.prompts.with_memory``), the report of its tree's receipts the checker needs
    (None on the bench's unchecked path) and the ``_Turn``."""
    # The model roles of the whole tree, pinned by the claim itself: a change applied
    # mid-run waits for the next run. Read first, so the pin goes in the claim's UPDATE.
    try:
        rows: dict[str, Any] | None = roles.configured_rows(roles.RUN_ROLES)
    except YimiError:
        rows = None  # unusable: for_run below says why, as the turn's failed brain call
    pin = roles.pin_of(rows) if rows is not None else None
    claimed = services.claim_for_turn(run_id, pin=pin)
    if claimed is None:
        return None
    run = claimed.run
    run.trace = {**(run.trace or {}), **(stages or {})}
    trace.mark(run, "claimed")
    if services.is_stale(run):
        return run, None, None, None, None
    history = services.history_for(run)
    # In a voice call the owner talks with the call's frozen persona and background (issue 21).
    # The claim read whether the device is in an open call: only then is there a snapshot to read.
    system = call_snapshot.call_prompt(run.owner_id, run.origin_device_id) if run.scope == "owner" and claimed.in_call else None
    messages = build_messages(run.scope, run.inbound.text, history, system=system)
    trace.mark(run, "prompt_built")
    memory = prepare_memory(run.owner_id, run.scope, run.inbound.seq)
    messages = with_memory(messages, history, memory)
    trace.mark(run, "memory_prepared")
    report = None if settings.YIMI_BENCH_UNCHECKED_REPLIES else run_tree_report(run, pack_results=claimed.pack_results)
    if report is not None and run.scope == "owner":  # her words, which the reply may quote back
        report.owner_words = [run.inbound.text, *(e.text for e in history if e.kind == TimelineEntry.Kind.UTTERANCE)]
    # A request about an image the device sent goes to the vision role instead (brain.vision).
    image = vision.image_for_run(run, may_be_linked=claimed.image_linked)
    try:
        # Pinned to what was read just now (this claim's pin held), else to the pin the run had.
        models = roles.of_rows(rows) if rows is not None and run.model_roles == pin else roles.for_run(run.id, pin=run.model_roles)
        turn = _Turn(models=models, image=image)
    except YimiError as exc:
        turn = _Turn(models=exc, image=image)
    if image is None:
        # The main turn's thinking switch: kept on the run in memory, so turn_context does
        # not write it; finish_run stores it with the outcome (a vision turn has none).
        run.thinking = decide_thinking(run.inbound.text, run.thinking)
        turn.active, turn.thinking = agent_loop.turn_context(run, tasks_working=claimed.tasks_working)
    return run, messages, memory, report, turn


async def execute_run(run_id: Any, *, stages: dict[str, float] | None = None) -> str:
    """Execute one run; returns the run's final state, or "skipped" if it was not ours.
    ``stages``: trace stages noted before it got here (``queued``); the run's trace
    (``brain.trace``) is kept in memory and written when the run closes."""
    prepared = await database_sync_to_async(_claim_and_prepare)(run_id, stages)
    if prepared is None:
        return "skipped"
    run, messages, memory, report, turn = prepared
    if messages is None or turn is None:  # stale: said more than 3 minutes ago
        expired = await database_sync_to_async(services.expire_claimed)(run)
        if expired is None:
            return "skipped"
        await reporting.announce_outcome(run, expired)
        return Run.State.EXPIRED
    beat = asyncio.ensure_future(keep_claim(lambda: services.heartbeat(run)))
    sent = 0
    delegated: list = []

    # Batched by time (at most one channel message per 20 ms): the first text at once.
    chunks = push.ReplyChunks(run.origin_device_id, {"run_id": str(run.id), "reply_to_seq": run.inbound.seq})

    async def send(delta: str) -> None:
        nonlocal sent
        await chunks.add(delta)
        if not sent:
            trace.mark(run, "first_chunk")
        sent += 1

    check = None
    if report is not None:
        check = truth.ReplyCheck(receipts=report.receipts, delivered_fact_ids=report.delivered, facts=report.facts,
                                 owner_words=report.owner_words)
    forward = CheckedStream(send, check)
    image = turn.image
    # The main turn's usage record waits for the store's trip (one trip fewer per run); if
    # the run ends before it, it is written on the way out.
    calls = usage.CallContext(run.id, deferred=[])
    async with _deferred_usage_written(calls):
        try:
            if isinstance(turn.models, YimiError):
                raise agent_loop.roles_unusable(run.id, turn.models)
            if image is not None:
                vision.admit_image_numbers(check, image)
                raw = await vision.vision_turn(run, messages, forward, image)
            else:
                raw, delegated = await main_turn(run, messages, forward, run_models=turn.models, active=turn.active,
                                                 thinking=turn.thinking, usage_for=calls)
            text = await forward.close(fallback=DELEGATED_ACK if delegated else NOTHING_BACKED) if check else raw
        except BrainError as exc:
            state, kind, code = Run.State.FAILED, TimelineEntry.Kind.NOTICE, exc.code
            text = redact_markers(services.NOTICE_TEXT[exc.code])
            log_event("run_failed", run_id=str(run.id), error_code=exc.code, detail=exc.detail)
        else:
            state, kind, code = Run.State.SUCCEEDED, TimelineEntry.Kind.REPLY, ""
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
        # Every chunk but the last is out before the reply is stored; the last goes with reply.done.
        last_chunk = await chunks.last()
        try:
            if image is not None:
                await vision.release(image)  # a guest's image is not kept beyond its request
            told = list(check.told) if check is not None and kind == TimelineEntry.Kind.REPLY else []
            entry = await database_sync_to_async(_store_outcome)(
                run, memory if state == Run.State.SUCCEEDED else None, state=state, text=text, kind=kind, error_code=code,
                told=told, calls=calls,
            )
        except BaseException:
            await _send_last_alone(chunks, last_chunk)  # what was streamed stays whole
            raise
    if entry is None:
        log_event("run_lost_claim", run_id=str(run.id))
        await _send_last_alone(chunks, last_chunk)  # the run is another worker's now
        return "skipped"
    await reporting.announce_outcome(run, entry, told=bool(told), last_chunk=last_chunk)
    for task in delegated:  # after the reply is stored, so the report comes after it
        await dispatch_task(task.id)
    return state


async def _send_last_alone(chunks: push.ReplyChunks, last_chunk: dict[str, Any] | None) -> None:
    """The reply's last chunk on its own, when no ``reply.done`` will carry it; a failure to
    send it is logged, not raised over the run's own outcome."""
    try:
        await chunks.send_last(last_chunk)
    except Exception as exc:  # noqa: BLE001 - the run's outcome (or its error) is what the caller reports
        log_event("reply_last_chunk_unsent", error=type(exc).__name__)


def _store_outcome(
    run: Run, memory: Any, *, state: str, text: str, kind: str, error_code: str, told: list[Any],
    calls: usage.CallContext | None = None,
) -> TimelineEntry | None:
    """Step 4's database work in one trip to the database thread (each trip costs a thread
    hop and a pool checkout): the turn's model usage records (``calls``, deferred), the
    memory hook's ``accept_memory`` when the brain accepted the prompt (``memory``; None
    after a failure), ``services.finish_run``, and, for a reply that told facts,
    ``capabilities.services.facts_carried`` (None: the claim was lost, nothing stored)."""
    if calls is not None:
        usage.record_deferred(calls)
    if memory is not None:
        accept_memory(memory)  # memory hook (issue 5): the brain accepted the prompt
    entry = services.finish_run(run, state=state, text=text, kind=kind, error_code=error_code)
    if entry is not None and told:
        capability_services.facts_carried(run.owner_id, entry.id, told)
    return entry


@contextlib.asynccontextmanager
async def _deferred_usage_written(calls: usage.CallContext) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await usage.record_deferred_safely(calls)  # nothing waits unless the run ended before its store
