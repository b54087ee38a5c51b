"""Incremental memory injection: only new facts each turn; an edit, a deletion
or a scope change rebuilds the session; the baseline advances only after the prompt was
accepted. Plus the runner hook that brings the core profile into every owner run."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from brain.runner import execute_run
from brain.services import accept_utterance
from memory.assertions import injection, preferences
from memory.assertions import store as assertions
from memory.assertions.store import CommitRequest
from memory.models import MemorySession
from tests.conftest import db_async, new_client_id, script


def believe(owner: Any, text: str, *, expected: int = 0, aid: str | None = None, predicate: str = "preference.food") -> str:
    return assertions.commit(
        CommitRequest(owner_id=owner.pk, request_id=uuid.uuid4().hex, predicate=predicate, payload={"text": text},
                      expected_version=expected, assertion_id=uuid.UUID(aid) if aid else None)
    ).assertion_id


def turn(owner: Any, anchor: int, scope: str = "owner", *, accept: bool = True) -> injection.InjectionPlan:
    plan = injection.plan(owner.pk, scope, anchor)
    if accept:
        assert injection.accept(plan)
    return plan


def test_the_first_turn_carries_the_current_facts(owner: Any) -> None:
    believe(owner, "不吃香菜")
    believe(owner, "喜欢冰美式", predicate="preference.drink")
    plan = turn(owner, anchor=1)
    assert (plan.mode, plan.reason) == ("rebuild", "new_session")
    assert "不吃香菜" in plan.new_block.text and "喜欢冰美式" in plan.new_block.text  # type: ignore[union-attr]


def test_only_facts_new_since_the_baseline_are_added_to_the_next_turn(owner: Any) -> None:
    believe(owner, "不吃香菜")
    first = turn(owner, anchor=1)
    believe(owner, "喜欢冰美式", predicate="preference.drink")
    second = turn(owner, anchor=3)
    assert second.mode == "incremental" and second.earlier == [first.new_block]
    assert "喜欢冰美式" in second.new_block.text and "不吃香菜" not in second.new_block.text  # type: ignore[union-attr]
    third = turn(owner, anchor=5)
    assert third.mode == "incremental" and third.new_block is None  # unchanged facts are not sent again
    assert [b.anchor for b in third.earlier] == [1, 3]


def test_an_edit_rebuilds_the_session(owner: Any) -> None:
    aid = believe(owner, "不吃香菜")
    turn(owner, anchor=1)
    believe(owner, "香菜现在能吃了", expected=1, aid=aid)
    plan = turn(owner, anchor=3)
    assert (plan.mode, plan.reason, plan.earlier) == ("rebuild", "fact_edited", [])
    assert "香菜现在能吃了" in plan.new_block.text  # type: ignore[union-attr]
    session = MemorySession.objects.get(owner=owner)
    assert (session.generation, session.reset_reason) == (2, "fact_edited")


def test_a_deletion_rebuilds_the_session_and_drops_the_forgotten_text_at_once(owner: Any) -> None:
    aid = believe(owner, "不吃香菜")
    believe(owner, "喜欢冰美式", predicate="preference.drink")
    turn(owner, anchor=1)
    assertions.forget(owner.pk, aid, request_id="forget-coriander")
    session = MemorySession.objects.get(owner=owner)
    assert session.blocks == [] and session.baseline == {}  # the stored prompt held the forgotten text
    plan = turn(owner, anchor=3)
    assert (plan.mode, plan.reason) == ("rebuild", "fact_forgotten")
    assert "不吃香菜" not in plan.new_block.text and "喜欢冰美式" in plan.new_block.text  # type: ignore[union-attr]


def test_a_scope_change_rebuilds_the_session(owner: Any) -> None:
    believe(owner, "不吃香菜")
    turn(owner, anchor=1)
    guest = turn(owner, anchor=3, scope="guest")
    assert (guest.mode, guest.reason, guest.new_block, guest.earlier) == ("rebuild", "scope_changed", None, [])
    back = turn(owner, anchor=5)
    assert (back.mode, back.reason) == ("rebuild", "scope_changed") and "不吃香菜" in back.new_block.text  # type: ignore[union-attr]


def test_the_baseline_advances_only_after_the_prompt_was_accepted(owner: Any) -> None:
    believe(owner, "不吃香菜")
    turn(owner, anchor=1)
    believe(owner, "喜欢冰美式", predicate="preference.drink")
    not_accepted = turn(owner, anchor=3, accept=False)  # the brain never took this prompt
    again = turn(owner, anchor=5)
    assert again.new_facts == not_accepted.new_facts and len(again.new_facts) == 1
    assert turn(owner, anchor=7).new_block is None


def test_a_plan_made_before_the_session_moved_on_is_not_accepted(owner: Any) -> None:
    believe(owner, "不吃香菜")
    turn(owner, anchor=1)
    believe(owner, "喜欢冰美式", predicate="preference.drink")
    slow, fast = injection.plan(owner.pk, "owner", 3), injection.plan(owner.pk, "owner", 4)
    assert injection.accept(fast) and not injection.accept(slow)
    assert [b["anchor"] for b in MemorySession.objects.get(owner=owner).blocks] == [1, 4]


def test_a_turn_that_added_nothing_writes_nothing_and_stales_no_other_plan(owner: Any) -> None:
    believe(owner, "不吃香菜")
    turn(owner, anchor=1)
    nothing = injection.plan(owner.pk, "owner", 2)  # no new fact: most turns
    assert (nothing.mode, nothing.new_block) == ("incremental", None)
    believe(owner, "喜欢冰美式", predicate="preference.drink")
    with_fact = injection.plan(owner.pk, "owner", 3)
    revision = MemorySession.objects.get(owner=owner).revision
    with CaptureQueriesContext(connection) as queries:
        assert injection.accept(nothing)
    assert len(queries) == 0 and MemorySession.objects.get(owner=owner).revision == revision
    assert injection.accept(with_fact)  # not made stale by the turn that added nothing
    assert [b["anchor"] for b in MemorySession.objects.get(owner=owner).blocks] == [1, 3]


def test_core_profile_and_speaking_preferences_are_not_injected_as_facts(owner: Any) -> None:
    assertions.commit(CommitRequest(owner_id=owner.pk, request_id="c", predicate="core_profile.entry",
                                    payload={"text": "住在杭州", "doc": "user"}, expected_version=0))
    preferences.set_preferences(owner.pk, "说话简短", expected_version=0, request_id="p")
    assert turn(owner, anchor=1).new_block is None


# --- the runner hook -----------------------------------------------------------------------------


def system_texts(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "system"]


@pytest.mark.django_db(transaction=True)
async def test_owner_runs_carry_the_core_profile_and_only_new_memory(make_device: Any, brain: Any, settings: Any, tmp_path: Path) -> None:
    settings.DATA_DIR = tmp_path
    sim = await db_async(make_device)()
    owner = await db_async(lambda: sim.device.owner)()

    def setup() -> None:
        assertions.commit(CommitRequest(owner_id=owner.pk, request_id="c", predicate="core_profile.entry",
                                        payload={"text": "名字叫王小明，住在杭州", "doc": "user"}, expected_version=0))
        preferences.set_preferences(owner.pk, "说话简短，多用口语", expected_version=0, request_id="p")
        believe(owner, "不吃香菜")

    await db_async(setup)()
    first = await db_async(accept_utterance)(sim.device, new_client_id(), "晚饭吃什么？")
    assert await execute_run(first.run_id) == "succeeded"
    request = brain.script.requests[-1]
    system = request["messages"][0]["content"]
    assert "USER.md" in system and "名字叫王小明，住在杭州" in system and "说话简短，多用口语" in system
    assert request["messages"][1]["role"] == "system" and "不吃香菜" in request["messages"][1]["content"]

    await db_async(believe)(owner, "喜欢冰美式", predicate="preference.drink")
    script(brain, status=500)  # the brain refuses the next prompt: the baseline must not move
    failed = await db_async(accept_utterance)(sim.device, new_client_id(), "喝点什么？")
    assert await execute_run(failed.run_id) == "failed"
    assert "喜欢冰美式" in system_texts(brain.script.requests[-1])[-1]
    brain.script.rules.clear()

    second = await db_async(accept_utterance)(sim.device, new_client_id(), "那喝点什么？")
    assert await execute_run(second.run_id) == "succeeded"
    messages = brain.script.requests[-1]["messages"]
    memory_blocks = [m["content"] for m in messages[1:] if m["role"] == "system"]
    assert len(memory_blocks) == 2
    assert "不吃香菜" in memory_blocks[0] and "喜欢冰美式" not in memory_blocks[0]  # the earlier block, unchanged
    assert "喜欢冰美式" in memory_blocks[1] and "不吃香菜" not in memory_blocks[1]  # only what is new
    assert messages[-2]["content"] == memory_blocks[1] and messages[-1] == {"role": "user", "content": "那喝点什么？"}
    first_user = next(i for i, m in enumerate(messages) if m.get("content") == "晚饭吃什么？")
    assert messages.index(next(m for m in messages if m["content"] == memory_blocks[0])) < first_user


@pytest.mark.django_db(transaction=True)
async def test_guest_runs_get_no_memory(make_device: Any, brain: Any, settings: Any, tmp_path: Path) -> None:
    settings.DATA_DIR = tmp_path
    guest = await db_async(make_device)(guest=True)
    await db_async(lambda: believe(guest.device.owner, "不吃香菜"))()
    accepted = await db_async(accept_utterance)(guest.device, new_client_id(), "你好")
    assert await execute_run(accepted.run_id) == "succeeded"
    text = str(brain.script.requests[-1]["messages"])
    assert "不吃香菜" not in text and "USER.md" not in text
