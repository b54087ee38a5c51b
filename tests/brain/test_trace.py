"""The per-utterance trace (brain.trace): every stage of a text's way is recorded on its
run, in order, written with few queries; the owner sees it as a bar on the run's page."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.backends.signals import connection_created
from django.test import Client
from django.test.utils import CaptureQueriesContext

from brain import trace
from brain.models import Run
from brain.runner import execute_run
from brain.services import accept_utterance, trace_stages_update
from tests.conftest import db_async, new_client_id, open_socket, receive_until, script

pytestmark = pytest.mark.django_db(transaction=True)

REPLY = "Here is the answer. It has two sentences."


async def test_a_text_over_the_websocket_records_every_stage_in_order(make_device: Any, brain: Any) -> None:
    script(brain, reply=REPLY, chunk_chars=8)
    sim = await db_async(make_device)()
    comm, _ = await open_socket(sim)
    await comm.send_json_to({"type": "text", "id": "t1", "text": "tell me something"})
    ack = await receive_until(comm, "text.ack")
    done = await receive_until(comm, "reply.done")
    assert done["text"] == REPLY
    before_ack = await db_async(Run.objects.get)(id=ack["run_id"])
    assert "ack" not in before_ack.trace and "done_sent" not in before_ack.trace  # only the device's ACK writes them
    await comm.send_json_to({"type": "ack", "seq": done["seq"], "status": "rendered"})
    await comm.send_json_to({"type": "ping", "id": "p"})  # frames are handled in order: the ACK is done after this
    await receive_until(comm, "pong")
    run = await db_async(Run.objects.get)(id=ack["run_id"])
    assert list(run.trace) and set(run.trace) == set(trace.STAGES), run.trace
    times = [run.trace[stage] for stage in trace.STAGES]
    assert times == sorted(times), run.trace  # each stage at or after the one before it
    # a second ACK (played) does not move the first one
    await comm.send_json_to({"type": "ack", "seq": done["seq"], "status": "played"})
    await comm.send_json_to({"type": "ping", "id": "p2"})
    await receive_until(comm, "pong")
    assert (await db_async(Run.objects.get)(id=ack["run_id"])).trace["ack"] == run.trace["ack"]
    await comm.disconnect()


async def test_a_failed_brain_call_has_no_first_token_and_shows_it_missing(make_device: Any, brain: Any) -> None:
    script(brain, status=500)
    sim = await db_async(make_device)()
    accepted = await db_async(lambda: accept_utterance(sim.device, new_client_id(), "hello?", received_ms=trace.now_ms()))()
    assert await execute_run(accepted.run_id, stages={"queued": trace.now_ms()}) == "failed"
    run = await db_async(Run.objects.get)(id=accepted.run_id)
    assert {"received", "admitted", "queued", "claimed", "brain_request", "stored"} <= set(run.trace)
    assert "first_token" not in run.trace and "first_chunk" not in run.trace
    segs = {s.stage: s for s in trace.segments(run.trace)}
    assert segs["first_token"].at_ms is None and segs["first_token"].percent == 0
    assert segs["stored"].after == "brain_request"  # the segment spans the missing stages
    html = trace.render_bar(run.trace)
    assert 'class="yimi-trace-stage missing" data-stage="first_token"' in html


def test_segments_are_proportional_and_missing_is_not_zero() -> None:
    segs = {s.stage: s for s in trace.segments({"received": 1000.0, "admitted": 1001.0, "queued": 1002.0, "claimed": 1010.0})}
    assert segs["received"].at_ms == 0 and segs["claimed"].at_ms == 10
    assert segs["claimed"].duration_ms == 8 and segs["claimed"].percent == pytest.approx(80)
    assert segs["prompt_built"].at_ms is None and segs["prompt_built"].duration_ms is None
    assert trace.stage_durations({"received": 1000.0, "queued": 1004.0, "claimed": 1005.5}) == {"queued": 4.0, "claimed": 1.5, "total": 5.5}
    assert trace.segments({"received": "soon", "admitted": True})[0].at_ms is None  # not numbers: missing


def test_the_run_page_shows_the_trace_bar_to_the_owner(owner: Any, make_device: Any) -> None:
    sim = make_device()
    accepted = accept_utterance(sim.device, new_client_id(), "how long did this take?", received_ms=trace.now_ms())
    stored = {"received": 1_000.0, "admitted": 1_004.0, "queued": 1_005.0, "claimed": 1_007.5, "prompt_built": 1_008.0,
              "memory_prepared": 1_010.0, "brain_request": 1_011.0, "first_token": 1_020.0, "first_chunk": 1_021.0, "stored": 1_030.0}
    Run.objects.filter(id=accepted.run_id).update(trace=stored)
    client = Client()
    client.force_login(owner)
    page = client.get(f"/admin/brain/run/{accepted.run_id}/change/").content.decode()
    assert 'class="yimi-trace"' in page
    for stage in ("admitted", "claimed", "first_token", "stored"):
        assert f'class="yimi-trace-segment" data-stage="{stage}"' in page
    assert "9.0 ms" in page  # brain_request -> first_token, 9 of 30 ms: wide enough for its label
    for stage in ("done_sent", "ack"):  # not recorded: listed as missing, no segment
        assert f'class="yimi-trace-stage missing" data-stage="{stage}"' in page
        assert f'class="yimi-trace-segment" data-stage="{stage}"' not in page


def test_acks_merge_into_the_stored_trace_with_one_update(owner: Any, make_device: Any) -> None:
    """One UPDATE on PostgreSQL; SQLite takes the ORM (step 3): BEGIN, the read, the UPDATE, COMMIT."""
    sim = make_device()
    accepted = accept_utterance(sim.device, new_client_id(), "hi", received_ms=5.0)
    with CaptureQueriesContext(connection) as queries:
        assert trace_stages_update(accepted.run_id, {"done_sent": 9.0, "ack": 11.0}).run() == 1
    assert len(queries) == (1 if connection.vendor == "postgresql" else 4), queries.captured_queries
    assert Run.objects.get(id=accepted.run_id).trace["received"] == 5.0
    assert Run.objects.get(id=accepted.run_id).trace["ack"] == 11.0
    assert trace_stages_update(Run.objects.exclude(id=accepted.run_id).values_list("id", flat=True).first()
                               or "00000000-0000-0000-0000-000000000000", {"ack": 1.0}).run() == 0  # no such run


# Upper bounds on the database round trips of one text (PostgreSQL or SQLite), so that a
# change that adds queries to the path shows here. Raise them only with a reason. The
# admission is 2 statements on PostgreSQL: the owner check (this device was not read with
# its account) and one for admission, entry and run (statements.insert_parts).
# The run's 17 on SQLite (9 on PostgreSQL, 12 before finish_run became one statement, 10 before the claim wrote the pin): claim (1 on PostgreSQL: the UPDATE … RETURNING joined with the
# inbound entry and whether the device is in an open call, an attached image names the
# request, the owner has background tasks working and the run's tree has pack receipts, so a
# plain run looks up none of those; SQLite 3, the ORM since step 3: BEGIN, the UPDATE, the run
# with its entry and those facts), history (1), memory (4: the core profile's
# render, the ambient log, the session, its facts; and 1 to accept it, here a new session's
# first turn: a later turn that adds no fact writes nothing), model roles (1: both
# roles' rows in one read, before the claim, whose UPDATE writes the pin), usage (1),
# finish (1 on PostgreSQL: the conditional close, the sequence number and the entry in one
# statement, where it was 3: lock, sequence number with entry, close; SQLite 7: BEGIN
# IMMEDIATE, lock, sequence number (3: the ORM), entry, close, its COMMIT not counted here).
def budgets() -> tuple[int, int]:
    """(admission, run) for the database the tests run on."""
    return (2, 9) if connection.vendor == "postgresql" else (14, 17)  # SQLite takes the ORM: step 3 (next seq: 3, was 1)


async def test_admission_and_run_stay_within_their_query_budget(make_device: Any, brain: Any) -> None:
    script(brain, reply=REPLY)
    sim = await db_async(make_device)()
    warm = await db_async(lambda: accept_utterance(sim.device, new_client_id(), "warm up"))()
    await execute_run(warm.run_id)  # first-use caches (roles, packs) are not what this counts

    def admit() -> tuple[Any, list[str]]:
        with CaptureQueriesContext(connection) as queries:
            accepted = accept_utterance(sim.device, new_client_id(), "count my queries", received_ms=trace.now_ms())
        return accepted, [q["sql"] for q in queries.captured_queries]

    accepted, admission = await db_async(admit)()
    admission_queries, run_queries = budgets()
    assert len(admission) <= admission_queries, "\n".join(admission)

    # The run's database work happens in sync_to_async threads, each call on a connection
    # opened for it (CONN_MAX_AGE 0 in tests): count on every connection opened meanwhile.
    counted: list[str] = []
    counting = True

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if counting:
            counted.append(sql)
        return execute(sql, params, many, context)

    def watch(sender: Any, connection: Any, **kwargs: Any) -> None:
        if count not in connection.execute_wrappers:  # one wrapper object may reconnect many times
            connection.execute_wrappers.append(count)

    connection_created.connect(watch)
    try:
        assert await execute_run(accepted.run_id, stages={"queued": trace.now_ms()}) == "succeeded"
    finally:
        counting = False
        connection_created.disconnect(watch)
    assert 0 < len(counted) <= run_queries, f"{len(counted)} queries:\n" + "\n".join(counted)


def test_a_runs_model_roles_are_pinned_and_read_with_few_queries(owner: Any, make_device: Any, brain: Any) -> None:
    """``roles.for_run``: a starting run reads both roles' rows in one query and pins them
    with one conditional write (one more to read the pin when the caller has not); a pinned
    run reads its pinned revisions in one query. The first-start import is checked once
    per process, not on every read."""
    from llm import roles

    sim = make_device()
    runs = [accept_utterance(sim.device, new_client_id(), f"text {i}").run_id for i in range(3)]
    roles.for_run(runs[0])  # the process has now seen the first-start import done

    with CaptureQueriesContext(connection) as starting:
        pinned = roles.for_run(runs[1])
    assert len(starting) <= 3, [q["sql"] for q in starting.captured_queries]
    with CaptureQueriesContext(connection) as claimed:
        roles.for_run(runs[2], pin=None)  # the runner's claim read the run: no pin yet
    assert len(claimed) <= 2, [q["sql"] for q in claimed.captured_queries]

    # A change applied now is for the next run: the pinned run keeps its versions.
    roles.apply("brain", provider="demo", base_url=brain.base_url, model="changed", options={}, source="console")
    with CaptureQueriesContext(connection) as again:
        later = roles.for_run(runs[1])
    assert len(again) <= 2, [q["sql"] for q in again.captured_queries]
    assert (later.brain.model, later.brain.version) == (pinned.brain.model, pinned.brain.version) != ("changed", later.brain.version)
    assert later.delegation.version == pinned.delegation.version
    with CaptureQueriesContext(connection) as given:
        assert roles.for_run(runs[1], pin=Run.objects.get(id=runs[1]).model_roles).brain.model == pinned.brain.model
    assert len(given) <= 2  # the pin read by the test, and the revisions
    assert roles.for_run(accept_utterance(sim.device, new_client_id(), "next").run_id).brain.model == "changed"
