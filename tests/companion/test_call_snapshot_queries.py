"""The query budget of call start (issue 21): ``accounts.voice.start_call`` +
``companion.snapshot.prepare`` sit before the call's first audio.

Counted, never timed, in autocommit as in production: a new call is the statements the
design cannot do without — the call's INSERT; then, in one transaction, the privacy epoch's
lock, the persona version with the continuity switch, time zone and existing snapshot, the
L3 address and interests, the newest summaries, each topic's state, the last calls'
openings, the content cards and the snapshot's INSERT. The count does not grow with the
owner's interests, topic rows, summaries or cards (nothing is read per candidate).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts import voice as identity
from companion import privacy_epoch
from companion import snapshot as call_snapshot
from companion.models import CallSnapshot, ContentCard
from memory.assertions import store as assertions
from memory.assertions.store import CommitRequest
from tests.support.companion_support import talk

pytestmark = pytest.mark.django_db(transaction=True)  # autocommit, as in production

# The budget: raise it only with a reason in docs/decisions/2026-12-03-query-budgets.md.
NEW_CALL = 11  # INSERT call; BEGIN, epoch lock, persona+settings, L3, summaries, topics, recent openings, cards, INSERT snapshot, COMMIT
RETRIED = 7  # INSERT call (refused: the call is open), its SELECT; BEGIN, epoch lock, persona+settings, the snapshot, COMMIT
CONTINUITY_OFF = 9  # a new call without continuity: no summaries, no topics (and only the address from L3)


def believe(owner_id: int, predicate: str, text: str) -> None:
    assertions.commit(CommitRequest(owner_id, uuid.uuid4().hex, predicate, {"text": text}, 0))


def start(device: Any, call_id: str) -> tuple[call_snapshot.Prepared, list[str]]:
    with CaptureQueriesContext(connection) as queries:
        call = identity.start_call(device, call_id, "phone_app")
        prepared = call_snapshot.prepare(call)
    return prepared, [q["sql"] for q in queries.captured_queries]


def test_a_call_start_stays_within_the_query_budget_whatever_the_owner_has(make_device: Any) -> None:
    device = make_device().device
    owner_id = device.owner_id
    believe(owner_id, "profile.address", "王师傅")
    believe(owner_id, "interest.craft", "修车床")
    talk(device, "past-1", [("owner", "我以前修车床"), ("yimi", "您在哪个厂？"), ("owner", "红星机床厂")])
    assert start(device, "warm")[0].state == "built"  # the owner's first start: persona v1, the epoch row

    first, issued = start(device, "counted-1")
    assert first.state == "built" and first.snapshot.background["interests"] and first.snapshot.background["address"] == "王师傅"
    assert len(issued) <= NEW_CALL, "\n".join(issued)
    # One transaction of its own, no savepoint on the way: a failed build starts a second one.
    # one transaction ("BEGIN IMMEDIATE" on SQLite), no savepoint
    assert [sql.split()[0] for sql in issued if sql.startswith(("BEGIN", "COMMIT", "SAVEPOINT"))] == ["BEGIN", "COMMIT"], issued
    assert sum(sql.startswith("INSERT") for sql in issued) == 2  # the call and its snapshot, nothing else written
    if connection.vendor == "postgresql":  # SQLite's BEGIN IMMEDIATE already holds the write lock
        assert any("FOR NO KEY UPDATE" in sql for sql in issued), "the build must hold the owner's privacy epoch"

    # More of everything the background and the opening choose from: not one more query.
    for n, hobby in enumerate(["听戏", "喝茶", "养花", "下象棋", "做饭", "钓鱼"]):
        believe(owner_id, f"interest.i{n}", hobby)
    talk(device, "past-2", [("owner", "别聊我老伴"), ("owner", "我喜欢听戏"), ("yimi", "京剧还是越剧？"), ("owner", "嗯"),
                            ("yimi", "哪出戏？"), ("owner", "嗯。")])
    talk(device, "past-3", [("owner", "我年轻时候在东北当过兵")])
    ContentCard.objects.bulk_create([
        ContentCard(id=f"extra-{n}", mode="chat", title=f"额外{n}", opening=f"开场{n}", tags=["修车床"], estimated_duration=60)
        for n in range(5)
    ])
    second, more = start(device, "counted-2")
    assert second.state == "built" and len(second.snapshot.background["interests"]) > len(first.snapshot.background["interests"])
    assert second.snapshot.background["avoid_topics"]  # the topic rows were read
    assert len(more) == len(issued), "\n".join(more)


def test_a_retried_start_and_a_start_without_continuity_stay_within_the_query_budget(make_device: Any) -> None:
    device = make_device().device
    owner_id = device.owner_id
    believe(owner_id, "interest.craft", "修车床")
    start(device, "warm")
    built, _ = start(device, "call-1")

    again, issued = start(device, "call-1")  # a reconnect: the same open call
    assert again.state == "reused" and again.snapshot.pk == built.snapshot.pk
    assert len(issued) <= RETRIED, "\n".join(issued)
    assert not any(sql.startswith("UPDATE") for sql in issued), "a reused snapshot is not saved again"

    privacy_epoch.set_continuity(owner_id, False)
    off, issued = start(device, "call-2")
    assert off.state == "built" and not off.snapshot.continuity and off.snapshot.background["interests"] == []
    assert len(issued) <= CONTINUITY_OFF, "\n".join(issued)
    assert not any("brain_topicstate" in sql or "brain_callsummary" in sql for sql in issued), issued
    assert CallSnapshot.objects.filter(owner_id=owner_id).count() == 3


def test_a_failed_build_rolls_back_and_writes_the_fallback_in_a_second_transaction(make_device: Any) -> None:
    """No savepoint guards the build: a build that broke the transaction itself (a database
    error) still ends in the documented fallback, and the next start builds it."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite answers 1 / 0 with NULL: only PostgreSQL aborts the transaction here")
    device = make_device().device
    believe(device.owner_id, "interest.craft", "修车床")
    call_snapshot.prepare(identity.start_call(device, "warm", "phone_app"))  # the epoch row exists
    call = identity.start_call(device, "call-1", "phone_app")

    def aborting(owner_id: int, *, continuity: bool) -> call_snapshot.Background:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")  # PostgreSQL aborts the transaction
        raise AssertionError("unreachable")

    with CaptureQueriesContext(connection) as queries:
        failed = call_snapshot.prepare(call, reader=aborting)
    assert failed.state == "fallback" and failed.snapshot.error == "snapshot_failed: DataError"
    stored = CallSnapshot.objects.get(call=call)
    assert stored.fallback and stored.opening == call_snapshot.GENERIC_OPENING and stored.attempts == 1
    issued = [q["sql"] for q in queries.captured_queries]
    assert sum("FOR NO KEY UPDATE" in sql for sql in issued) == 2  # the fallback took the epoch lock again
    assert call_snapshot.prepare(call).state == "rebuilt" and CallSnapshot.objects.get(call=call).attempts == 2


def test_two_starts_of_one_new_call_take_turns_on_the_epoch_lock(make_device: Any) -> None:
    """Without the call row's lock, the owner's epoch lock alone keeps two starts of the same
    call apart: the second waits while the first builds, then reuses its snapshot."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks are a PostgreSQL behaviour; SQLite serializes whole write transactions")
    device = make_device().device
    believe(device.owner_id, "interest.craft", "修车床")
    call = identity.start_call(device, "call-1", "phone_app")
    call_snapshot.prepare(identity.start_call(device, "warm", "phone_app"))  # the epoch row exists
    second_waits = threading.Event()
    states: dict[str, str] = {}

    def blocked_backends() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")  # else read once per transaction
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
            return int(cursor.fetchone()[0])

    def first_reader(owner_id: int, *, continuity: bool) -> call_snapshot.Background:
        threading.Thread(target=run, args=("second", call_snapshot.read_background), daemon=True).start()
        for _ in range(500):  # until the second start waits on the lock this build holds (at most ~10 s)
            if blocked_backends():
                second_waits.set()
                break
            time.sleep(0.02)
        return call_snapshot.read_background(owner_id, continuity=continuity)

    def run(name: str, reader: Any) -> None:
        try:
            states[name] = call_snapshot.prepare(call, reader=reader).state
        finally:
            connection.close()

    first = threading.Thread(target=run, args=("first", first_reader))
    first.start()
    first.join(30)
    for _ in range(500):
        if "second" in states:
            break
        time.sleep(0.02)
    assert second_waits.is_set(), "the second start never waited on the owner's epoch lock"
    assert states == {"first": "built", "second": "reused"}
    assert CallSnapshot.objects.filter(call=call).count() == 1
