"""Executing one run: claim it, ask the brain, stream the reply to the device that spoke.

Async so that the same code runs inside a Celery worker (``asyncio.run``) and, in the
embedded default without a broker, on the web server's own event loop.

Steps: 1. claim the run (compare-and-set; a run someone else holds is left alone);
2. a run whose utterance is older than 3 minutes is expired with a notice, never
answered late; 3. the main agent's turn (``agent_loop.main_turn``): its text streams
to the origin device as ``reply.chunk`` frames while a heartbeat task keeps the claim
alive, and any delegation creates sub-agent tasks; 4. store the whole reply in the
timeline, send ``reply.done`` with its sequence number, tell the owner's other devices
there is something new to sync, then start the delegated tasks. Any failure of the
model call ends in an honest ``notice`` entry instead of a reply.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from channels.db import database_sync_to_async

from brain import services
from brain.agent_loop import main_turn
from brain.client import BrainError
from brain.dispatch import dispatch_task, keep_claim
from brain.models import Run
from brain.prompts import accept_memory, build_messages, prepare_memory, with_memory
from memory.models import TimelineEntry
from yimi_project import push
from yimi_project.logs import log_event


async def execute_run(run_id: Any) -> str:
    """Execute one run; returns the run's final state, or "skipped" if it was not ours."""
    run = await database_sync_to_async(services.claim_run)(run_id)
    if run is None:
        return "skipped"
    if services.is_stale(run):
        expired = await database_sync_to_async(services.expire_claimed)(run)
        if expired is None:
            return "skipped"
        await _announce(run, expired)
        return Run.State.EXPIRED
    history = await database_sync_to_async(services.history_for)(run)
    messages = build_messages(run.scope, run.inbound.text, history)
    # memory hook (issue 5): core profile + incremental L3 facts (brain.prompts.with_memory)
    memory = await database_sync_to_async(prepare_memory)(run.owner_id, run.scope, run.inbound.seq)
    messages = with_memory(messages, history, memory)
    beat = asyncio.ensure_future(keep_claim(lambda: services.heartbeat(run)))
    sent = 0
    delegated: list = []

    async def forward(delta: str) -> None:
        nonlocal sent
        await push.to_device(
            run.origin_device_id,
            {"type": "reply.chunk", "run_id": str(run.id), "reply_to_seq": run.inbound.seq, "index": sent, "text": delta},
        )
        sent += 1

    try:
        text, delegated = await main_turn(run, messages, forward)
    except BrainError as exc:
        state, kind, text, code = Run.State.FAILED, TimelineEntry.Kind.NOTICE, services.NOTICE_TEXT[exc.code], exc.code
        log_event("run_failed", run_id=str(run.id), error_code=exc.code, detail=exc.detail)
    else:
        state, kind, code = Run.State.SUCCEEDED, TimelineEntry.Kind.REPLY, ""
        await database_sync_to_async(accept_memory)(memory)  # memory hook (issue 5): the brain accepted the prompt
    finally:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
    entry = await database_sync_to_async(services.finish_run)(run, state=state, text=text, kind=kind, error_code=code)
    if entry is None:
        log_event("run_lost_claim", run_id=str(run.id))
        return "skipped"
    await _announce(run, entry)
    for task in delegated:  # after the reply is stored, so the report comes after it
        await dispatch_task(task.id)
    return state


async def _announce(run: Run, entry: TimelineEntry) -> None:
    """Deliver the outcome to the origin device and tell every device to sync."""
    if entry.kind == TimelineEntry.Kind.REPLY:
        frame = {"type": "reply.done", "run_id": str(run.id), "reply_to_seq": run.inbound.seq, "seq": entry.seq, "text": entry.text}
    else:
        frame = {
            "type": "notice",
            "run_id": str(run.id),
            "reply_to_seq": run.inbound.seq,
            "seq": entry.seq,
            "code": entry.notice_code,
            "text": entry.text,
        }
    await push.to_device(run.origin_device_id, frame)
    await push.to_owner(run.owner_id, {"type": "timeline.new", "seq": entry.seq})
