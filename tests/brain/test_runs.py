from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from brain.models import Run
from brain.recovery import recover_runs
from brain.runner import execute_run
from brain.services import accept_utterance, claim_run, finish_run, is_stale
from memory.models import TimelineEntry
from tests.conftest import db_async, new_client_id, open_socket, receive_until, script, use_brain

pytestmark = pytest.mark.django_db(transaction=True)


def utter(sim: Any, text: str = "hello") -> Any:
    return accept_utterance(sim.device, new_client_id(), text)


def age_run(run_id: Any, seconds: int) -> None:
    run = Run.objects.get(id=run_id)
    TimelineEntry.objects.filter(id=run.inbound_id).update(created_at=timezone.now() - timedelta(seconds=seconds))
    Run.objects.filter(id=run_id).update(created_at=timezone.now() - timedelta(seconds=seconds))


@pytest.mark.parametrize(
    "rule, code",
    [
        ({"status": 500}, "brain_error"),
        ({"hang_seconds": 30}, "brain_timeout"),
        ({"reply": "half an ans", "truncate": True}, "brain_bad_response"),
        ({"reply": ""}, "brain_bad_response"),
    ],
)
async def test_failed_model_call_produces_an_honest_notice_not_a_reply(make_device: Any, brain: Any, settings: Any, rule: dict[str, Any], code: str) -> None:
    if rule.get("hang_seconds"):  # a hang always outlasts 0.5 s; the other answers get the usual 5 s
        await db_async(use_brain)(brain.base_url, timeout_seconds=0.5)
    script(brain, **rule)
    sim = await db_async(make_device)()
    comm, _ = await open_socket(sim)
    await comm.send_json_to({"type": "text", "id": "q", "text": "question"})
    await receive_until(comm, "text.ack")
    notice = await receive_until(comm, "notice", "reply.done", timeout=10)
    assert notice["type"] == "notice" and notice["code"] == code and "Nothing was answered" in notice["text"]
    entries = await db_async(lambda: list(TimelineEntry.objects.values_list("kind", "notice_code")))()
    assert entries == [("utterance", ""), ("notice", code)]
    run = await db_async(Run.objects.get)()
    assert run.state == "failed" and run.error_code == code
    await comm.disconnect()


async def test_unreachable_brain_is_a_notice(make_device: Any, brain: Any, settings: Any) -> None:
    await db_async(use_brain)("http://127.0.0.1:9/v1")  # discard port: nothing listens
    sim = await db_async(make_device)()
    accepted = await db_async(utter)(sim)
    assert await execute_run(accepted.run_id) == "failed"
    notice = await db_async(TimelineEntry.objects.get)(kind="notice")
    assert notice.notice_code == "brain_unreachable" and notice.reply_to_id == accepted.entry.id


async def test_run_older_than_three_minutes_is_expired_not_answered(make_device: Any, brain: Any) -> None:
    sim = await db_async(make_device)()
    accepted = await db_async(utter)(sim)
    await db_async(age_run)(accepted.run_id, 181)
    assert await execute_run(accepted.run_id) == "expired"
    assert brain.script.requests == []  # the model was never asked
    notice = await db_async(TimelineEntry.objects.get)(kind="notice")
    assert notice.notice_code == "run_expired"


async def test_run_just_under_three_minutes_is_still_answered(make_device: Any, brain: Any) -> None:
    sim = await db_async(make_device)()
    accepted = await db_async(utter)(sim)
    run = await db_async(Run.objects.select_related("inbound").get)(id=accepted.run_id)
    said = run.inbound.created_at  # on the test's clock: three minutes exactly is still in time
    assert not is_stale(run, now=said + timedelta(seconds=180))
    assert is_stale(run, now=said + timedelta(seconds=180, microseconds=1))
    assert await execute_run(accepted.run_id) == "succeeded"


async def test_recovery_runs_queued_runs_left_by_a_dead_process(make_device: Any, brain: Any, settings: Any) -> None:
    sim = await db_async(make_device)()
    accepted = await db_async(utter)(sim, "were you there?")  # stored, never dispatched
    assert await recover_runs() == (0, 0)  # just queued: probably still in the broker
    older = timedelta(seconds=settings.RUN_RECOVERY_SECONDS + 1)  # its message is older than the sweep interval
    await db_async(Run.objects.filter(id=accepted.run_id).update)(created_at=timezone.now() - older)
    recovered, expired = await recover_runs()
    assert (recovered, expired) == (1, 0)
    deadline = time.monotonic() + 60  # seen, not timed: the 60 s only bound a failure
    while (run := await db_async(Run.objects.get)(id=accepted.run_id)).state != "succeeded":
        assert time.monotonic() < deadline, f"the recovered run is still {run.state}"
        await asyncio.sleep(0.05)
    reply = await db_async(TimelineEntry.objects.get)(kind="reply")
    assert "were you there?" in reply.text


async def test_recovery_takes_over_a_running_run_whose_worker_died(make_device: Any, brain: Any, settings: Any) -> None:
    sim = await db_async(make_device)()
    accepted = await db_async(utter)(sim)
    dead = await db_async(claim_run)(accepted.run_id)  # a worker claimed it, then died
    assert dead is not None and await db_async(claim_run)(accepted.run_id) is None  # held while fresh
    await db_async(Run.objects.filter(id=accepted.run_id).update)(
        heartbeat_at=timezone.now() - timedelta(seconds=settings.RUN_HEARTBEAT_STALE_SECONDS + 1)
    )
    assert await execute_run(accepted.run_id) == "succeeded"
    run = await db_async(Run.objects.get)(id=accepted.run_id)
    assert run.attempts == 2
    # the dead worker, were it to wake up, can no longer store its outcome
    assert await db_async(finish_run)(dead, state="succeeded", text="late", kind="reply") is None
    assert await db_async(TimelineEntry.objects.filter(kind="reply").count)() == 1


async def test_recovery_expires_old_runs_instead_of_answering(make_device: Any, brain: Any) -> None:
    sim = await db_async(make_device)()
    accepted = await db_async(utter)(sim)
    await db_async(age_run)(accepted.run_id, 600)
    assert await recover_runs() == (0, 1)
    run = await db_async(Run.objects.get)(id=accepted.run_id)
    assert run.state == "expired" and brain.script.requests == []


async def test_a_finished_run_is_never_executed_again(make_device: Any, brain: Any) -> None:
    sim = await db_async(make_device)()
    accepted = await db_async(utter)(sim)
    assert await execute_run(accepted.run_id) == "succeeded"
    assert await execute_run(accepted.run_id) == "skipped"
    assert len(brain.script.requests) == 1


async def test_owner_run_sees_recent_history_and_the_demo_brain_says_what_it_is(make_device: Any, brain: Any) -> None:
    sim = await db_async(make_device)()
    first = await db_async(utter)(sim, "my name is Lin")
    await execute_run(first.run_id)
    second = await db_async(utter)(sim, "what is my name?")
    await execute_run(second.run_id)
    contents = [m["content"] for m in brain.script.requests[-1]["messages"]]
    assert "my name is Lin" in contents and contents[-1] == "what is my name?"
    reply = await db_async(TimelineEntry.objects.filter(kind="reply").last)()
    assert reply.text.startswith("[demo brain]")


def test_the_claim_reads_the_inbound_entry_and_whether_a_call_or_an_image_is_there(make_device: Any) -> None:
    """``claim_for_turn`` (one statement on PostgreSQL, the ORM on SQLite): the claimed run
    comes with its inbound entry, whether its device is in an open call (only then is a call
    snapshot looked up) and whether an attached image with a file names its request (only
    then is the linked image looked up); a second claim of a fresh run gets nothing."""
    from accounts.models import VoiceCall
    from brain.services import claim_for_turn
    from memory.models import ImageRecord

    sim = make_device()
    plain = utter(sim, "plain words")
    claimed = claim_for_turn(plain.run_id)
    assert claimed is not None and claimed.run.state == "running" and claimed.run.attempts == 1
    assert claimed.run.inbound.text == "plain words" and claimed.run.inbound.id == plain.entry.id
    assert (claimed.in_call, claimed.image_linked) == (False, False)
    assert claim_for_turn(plain.run_id) is None and claim_for_turn("not-a-uuid") is None

    call = VoiceCall.objects.create(owner_id=sim.device.owner_id, device=sim.device, call_id="c1", channel="app")
    client_id = new_client_id()
    image = dict(owner_id=sim.device.owner_id, device=sim.device, scope="owner", retention="keep", content_type="image/png",
                 width=1, height=1, size_bytes=1, sha256="0" * 64, uploaded_at=timezone.now(), about_client_id=client_id)
    ImageRecord.objects.create(**image, state=ImageRecord.State.ATTACHED, path="")  # purged: no file
    ImageRecord.objects.create(**image, state=ImageRecord.State.UPLOADED, path="images/x.png")  # not attached
    asked = accept_utterance(sim.device, client_id, "what is this")
    claimed = claim_for_turn(asked.run_id)
    assert claimed is not None and (claimed.in_call, claimed.image_linked) == (True, False)

    ImageRecord.objects.create(**image, state=ImageRecord.State.ATTACHED, path="images/y.png")
    VoiceCall.objects.filter(id=call.id).update(ended_at=timezone.now())
    again = accept_utterance(sim.device, client_id + "-2", "again")
    ImageRecord.objects.filter(path="images/y.png").update(about_client_id=client_id + "-2")
    claimed = claim_for_turn(again.run_id)
    assert claimed is not None and (claimed.in_call, claimed.image_linked) == (False, True)
    assert (claimed.tasks_working, claimed.pack_results) == (False, False)


def test_the_claim_reads_whether_tasks_work_and_whether_the_tree_has_pack_results(make_device: Any, settings: Any) -> None:
    """The claim's other two facts: the owner has a background task (depth 1) still working
    (only then are they listed), and the run's tree has a pack receipt, not the gateway's
    block or ask (only then is the report's receipts read); a re-claimed run finds its own."""
    from brain.models import AgentTask
    from brain.services import claim_for_turn
    from capabilities.models import ReceiptRecord, ToolCall

    sim = make_device()
    earlier = utter(sim, "earlier")
    AgentTask.objects.create(run_id=earlier.run_id, goal="done already", state=AgentTask.State.SUCCEEDED)
    AgentTask.objects.create(run_id=earlier.run_id, goal="a step", state=AgentTask.State.RUNNING, depth=2)
    first = utter(sim, "first")
    claimed = claim_for_turn(first.run_id)
    assert claimed is not None and (claimed.tasks_working, claimed.pack_results) == (False, False)

    AgentTask.objects.create(run_id=earlier.run_id, goal="book a table", state=AgentTask.State.RUNNING)
    owner_id = sim.device.owner_id
    call = ToolCall.objects.create(owner_id=owner_id, run_id=first.run_id, tool="t", fingerprint="f", idempotency_key="k",
                                   decision="allow")
    receipt = dict(owner_id=owner_id, call=call, task_id="task-1", status="succeeded", receipt={}, content_fingerprint="c")
    ReceiptRecord.objects.create(**receipt, written_by_gateway=True)  # a block: not a pack result
    Run.objects.filter(id=first.run_id).update(
        heartbeat_at=timezone.now() - timedelta(seconds=settings.RUN_HEARTBEAT_STALE_SECONDS + 1)
    )
    again = claim_for_turn(first.run_id)  # its worker died: claimed again
    assert again is not None and again.run.attempts == 2
    assert (again.tasks_working, again.pack_results) == (True, False)
    ReceiptRecord.objects.create(**receipt, revision=2)
    Run.objects.filter(id=first.run_id).update(
        heartbeat_at=timezone.now() - timedelta(seconds=settings.RUN_HEARTBEAT_STALE_SECONDS + 1)
    )
    third = claim_for_turn(first.run_id)
    assert third is not None and (third.tasks_working, third.pack_results) == (True, True)


def test_the_claim_pins_the_roles_once_and_the_close_records_the_thinking_switch(make_device: Any, settings: Any) -> None:
    """``claim_for_turn(pin=)``: the claim's UPDATE writes the pin unless the run has one (a
    run claimed again keeps the roles it started with, and the claim returns that pin);
    ``finish_run`` records the turn's thinking switch from the run in memory, keeping one
    already stored (the front's), None writing none (a vision turn)."""
    from brain.services import claim_for_turn

    sim = make_device()
    pin = {"brain": {"configured_as": "brain", "version": 1}, "delegation": {"configured_as": "brain", "version": 1}}
    first = utter(sim, "think carefully")
    claimed = claim_for_turn(first.run_id, pin=pin)
    assert claimed is not None and claimed.run.model_roles == pin
    assert Run.objects.get(id=first.run_id).model_roles == pin
    Run.objects.filter(id=first.run_id).update(
        heartbeat_at=timezone.now() - timedelta(seconds=settings.RUN_HEARTBEAT_STALE_SECONDS + 1)
    )
    again = claim_for_turn(first.run_id, pin={"brain": {"configured_as": "brain", "version": 2}})
    assert again is not None and again.run.model_roles == pin  # the first pin holds
    assert Run.objects.get(id=first.run_id).model_roles == pin
    unpinned = utter(sim)
    bare = claim_for_turn(unpinned.run_id)
    assert bare is not None and bare.run.model_roles is None  # no pin asked: none written

    run = again.run
    run.thinking = True
    assert finish_run(run, state=Run.State.SUCCEEDED, text="ok", kind=TimelineEntry.Kind.REPLY) is not None
    assert Run.objects.get(id=first.run_id).thinking is True

    fronted = accept_utterance(sim.device, new_client_id(), "hi", thinking=False)
    run = claim_run(fronted.run_id)
    assert run is not None
    run.thinking = True  # not what is stored: the front's switch is kept
    finish_run(run, state=Run.State.SUCCEEDED, text="ok", kind=TimelineEntry.Kind.REPLY)
    assert Run.objects.get(id=fronted.run_id).thinking is False
    vision = utter(sim, "what is this")
    run = claim_run(vision.run_id)
    assert run is not None and run.thinking is None
    finish_run(run, state=Run.State.SUCCEEDED, text="ok", kind=TimelineEntry.Kind.REPLY)
    assert Run.objects.get(id=vision.run_id).thinking is None


def test_closing_a_run_is_one_statement_on_postgresql_and_a_lost_claim_writes_nothing(make_device: Any) -> None:
    """``finish_run`` in autocommit, as the runner's store trip calls it: on PostgreSQL one
    statement (the conditional close, the owner's next number and the entry), elsewhere a
    transaction. What it stores is the same either way; a run no longer ours stores nothing
    and takes no number (the next entry has the next seq: no gap)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from memory.models import TimelineCounter

    sim = make_device()
    warm = utter(sim, "warm")
    finish_run(claim_run(warm.run_id), state="succeeded", text="warm reply", kind="reply")  # first use: prepared statements
    accepted = utter(sim)
    run = claim_run(accepted.run_id)
    assert run is not None
    run.trace = {"claimed": 1.0}
    with CaptureQueriesContext(connection) as queries:
        entry = finish_run(run, state="succeeded", text="the answer", kind="reply")
    assert entry is not None
    # SQLite takes the ORM (step 3): the owner's next number is 3 statements there, where it was one upsert
    assert len(queries.captured_queries) == (1 if connection.vendor == "postgresql" else 8), queries.captured_queries
    stored = TimelineEntry.objects.get(id=entry.id)
    assert (stored.seq, stored.kind, stored.text, stored.reply_to_id, stored.device_id, stored.scope, stored.notice_code) == (
        entry.seq, "reply", "the answer", accepted.entry.id, sim.device.id, "owner", "")
    assert entry.seq == accepted.entry.seq + 1
    closed = Run.objects.get(id=accepted.run_id)
    assert (closed.state, closed.result_entry_id, closed.error_code) == ("succeeded", entry.id, "")
    assert closed.finished_at is not None and closed.trace["claimed"] == 1.0 and closed.trace["stored"] > 0

    # a notice keeps its code; a run taken over (attempts moved on) or already closed stores nothing
    other = utter(sim, "again")
    mine = claim_run(other.run_id)
    assert mine is not None
    Run.objects.filter(id=other.run_id).update(attempts=mine.attempts + 1)
    last_seq = TimelineCounter.objects.get(owner_id=sim.device.owner_id).last_seq
    assert finish_run(mine, state="failed", text="x", kind="notice", error_code="brain_error") is None
    assert finish_run(run, state="succeeded", text="twice", kind="reply") is None  # closed above
    assert TimelineCounter.objects.get(owner_id=sim.device.owner_id).last_seq == last_seq
    assert not TimelineEntry.objects.filter(text__in=["x", "twice"]).exists()
    assert Run.objects.get(id=other.run_id).state == "running"
    mine.attempts += 1
    notice = finish_run(mine, state="failed", text="it failed", kind="notice", error_code="brain_error")
    assert notice is not None and notice.seq == last_seq + 1
    assert TimelineEntry.objects.get(id=notice.id).notice_code == "brain_error"
    assert Run.objects.get(id=other.run_id).result_entry_id == notice.id


async def test_a_reply_whose_store_fails_still_streams_every_chunk(make_device: Any, brain: Any, monkeypatch: Any) -> None:
    """The last chunk waits to go with ``reply.done`` (``ReplyChunks.last``); when the store
    fails there is no ``reply.done``, and the chunk goes on its own: the stream the device
    saw is the whole reply."""
    from brain import runner

    reply = "Sunny and mild today. Take a light jacket."
    script(brain, reply=reply, chunk_chars=5)
    sim = await db_async(make_device)()
    comm, _ = await open_socket(sim)
    accepted = await db_async(utter)(sim)

    def broken_store(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(runner, "_store_outcome", broken_store)
    with pytest.raises(RuntimeError):
        await execute_run(accepted.run_id)
    chunks: list[str] = []
    while "".join(chunks) != reply:
        frame = await receive_until(comm, "reply.chunk", "reply.done")
        assert frame["type"] == "reply.chunk" and frame["index"] == len(chunks)
        chunks.append(frame["text"])
    assert len(chunks) >= 2
    await comm.disconnect()
