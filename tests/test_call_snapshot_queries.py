"""The query budget of call start (issue 21): ``accounts.voice.start_call`` +
``brain.call_snapshot.prepare`` sit before the call's first audio.

Counted, never timed, in autocommit as in production: a new call is the statements the
design cannot do without — the call's INSERT; then, in one transaction, the privacy epoch's
lock, the persona version with the continuity switch, time zone and existing snapshot, the
L3 address and interests, the newest summaries, each topic's state, the last calls'
openings, the content cards and the snapshot's INSERT. The count does not grow with the
owner's interests, topic rows, summaries or cards (nothing is read per candidate).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts import voice as identity
from brain import call_snapshot, privacy_epoch
from brain.companion_models import CallSnapshot, ContentCard
from memory import assertions
from memory.assertions import CommitRequest
from tests.companion_support import talk

pytestmark = pytest.mark.django_db(transaction=True)  # autocommit, as in production

# The budget: raise it only with a reason in docs/architecture.md ("query budget").
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
    assert [sql for sql in issued if sql.startswith(("BEGIN", "COMMIT", "SAVEPOINT"))] == ["BEGIN", "COMMIT"], issued
    assert sum(sql.startswith("INSERT") for sql in issued) == 2  # the call and its snapshot, nothing else written
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
