"""The agent loop: delegation, the per-run budget, steering, milestones, and one whole
text → run → delegate → workspace tool over MCP → receipt → checked reply → ACK."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from brain import agents
from brain.agent_loop import execute_agent_task
from brain.models import AgentTask, Run
from brain.services import accept_utterance
from capabilities.mcp_host import runtime
from capabilities.models import ReceiptRecord, ToldFact, ToolCall
from memory.models import TimelineEntry
from tests.conftest import db_async, new_client_id, open_socket, receive_until, script
from tests.support.gateway_support import DEMO_TOOLS, copy_repo_pack, write_pack
from yimi_project.errors import YimiError

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def packs(tmp_path: Path, settings: Any) -> Any:
    directory = tmp_path / "packs"
    directory.mkdir()
    copy_repo_pack(directory, "workspace")
    write_pack(directory, "demo")
    settings.YIMI_PACKS_DIR = directory
    settings.YIMI_WORKSPACE_DIR = tmp_path / "workspace"
    runtime.reset_for_tests()
    yield directory
    runtime.reset_for_tests()


LATER_TOOLS = DEMO_TOOLS.replace('value("answer", 42', 'value("later_answer", 7')


def new_run(sim: Any, text: str = "do things") -> Run:
    return Run.objects.get(id=accept_utterance(sim.device, new_client_id(), text).run_id)


# --- budget -------------------------------------------------------------------------------------


def test_budget_is_shared_by_concurrent_subagents_and_never_exceeds_120(make_device: Any) -> None:
    run = new_run(make_device())
    taken: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(3)

    def subagent() -> None:
        start.wait()
        for _ in range(60):
            unit = agents.consume_budget(run.id)
            if unit is not None:
                with lock:
                    taken.append(unit.used)
        connections.close_all()

    threads = [threading.Thread(target=subagent) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken) == list(range(1, 121))
    assert Run.objects.get(id=run.id).tool_calls_used == 120
    assert agents.consume_budget(run.id) is None


def test_every_twentieth_call_is_a_milestone(make_device: Any) -> None:
    run = new_run(make_device())
    milestones = [u.used for u in (agents.consume_budget(run.id) for _ in range(45)) if u and u.milestone]
    assert milestones == [20, 40]


# --- delegation limits ---------------------------------------------------------------------------


def test_at_most_three_subagents_at_once(make_device: Any) -> None:
    run = new_run(make_device())
    tasks = [agents.delegate(run.id, f"goal {i}") for i in range(3)]
    with pytest.raises(YimiError) as err:
        agents.delegate(run.id, "a fourth")
    assert err.value.code == "pool_full"
    AgentTask.objects.filter(id=tasks[0].id).update(state=AgentTask.State.SUCCEEDED)
    assert agents.delegate(run.id, "now there is room").depth == 1


def test_delegation_is_at_most_two_deep(make_device: Any) -> None:
    run = new_run(make_device())
    first = agents.delegate(run.id, "level one")
    second = agents.delegate(run.id, "level two", parent=first)
    assert second.depth == 2
    with pytest.raises(YimiError) as err:
        agents.delegate(run.id, "level three", parent=second)
    assert err.value.code == "too_deep"


def test_a_run_with_working_subagents_still_binds_tool_calls(make_device: Any, packs: Path) -> None:
    from capabilities.services import CallRequest, decide

    run = new_run(make_device())
    Run.objects.filter(id=run.id).update(state=Run.State.SUCCEEDED)  # the main turn is over
    task = agents.delegate(run.id, "background work")
    assert decide(CallRequest(str(run.id), "demo__read", {})).decision == "allow"
    AgentTask.objects.filter(id=task.id).update(state=AgentTask.State.SUCCEEDED)
    assert decide(CallRequest(str(run.id), "demo__read", {})).code == "run_ended"


# --- steering -------------------------------------------------------------------------------------


def test_steering_reaches_a_working_task_once_and_is_refused_after_it_finished(make_device: Any) -> None:
    run = new_run(make_device())
    task = agents.delegate(run.id, "book a table")
    agents.steer(run.id, task.id, "by the window")
    assert agents.take_steering(task.id) == ["by the window"]
    assert agents.take_steering(task.id) == []
    AgentTask.objects.filter(id=task.id).update(state=AgentTask.State.SUCCEEDED)
    with pytest.raises(YimiError) as err:
        agents.steer(run.id, task.id, "too late")
    assert err.value.code == "task_finished"


async def test_owner_addition_is_steered_to_the_working_subagent(make_device: Any, brain: Any, packs: Path) -> None:
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim, "book a table")
    task = await db_async(agents.delegate)(run.id, "book a table for two")
    await db_async(agents.steer)(run.id, task.id, "靠窗")
    script(brain, match="book a table", requires_tool="demo__read", reply="", tool_calls=[{"name": "demo__read", "arguments": {}}])
    script(brain, when="tool", requires_tool="demo__read", reply="Booked, by the window.")
    script(brain, when="user", match="Background task finished", reply="Done.")
    await execute_agent_task(task.id)
    sub_requests = [r for r in brain.script.requests if any(t["function"]["name"] == "demo__read" for t in r.get("tools", []))]
    contents = [m.get("content") for m in sub_requests[0]["messages"]]
    assert "The owner adds: 靠窗" in contents


# --- the loop over real MCP ------------------------------------------------------------------------


async def test_subagent_calls_a_pack_tool_through_the_gateway_and_reports_once(make_device: Any, brain: Any, packs: Path, settings: Any) -> None:
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim, "save a note")
    task = await db_async(agents.delegate)(run.id, "write hello into notes/a.txt")
    script(brain, requires_tool="workspace__write_file", reply="", tool_calls=[
        {"name": "workspace__write_file", "arguments": {"path": "notes/a.txt", "content": "hello", "owner_requested": True, "run_id": "forged"}},
    ])
    script(brain, when="tool", requires_tool="workspace__write_file", reply="Saved notes/a.txt.")
    script(brain, match="Background task finished", reply="已经写好了 notes/a.txt，一共 5 字节。还写了 99 行。")
    assert await execute_agent_task(task.id) == "succeeded"

    assert (settings.YIMI_WORKSPACE_DIR / "notes" / "a.txt").read_text() == "hello"
    call = await db_async(ToolCall.objects.get)(tool="workspace__write_file")
    assert call.owner_requested and call.agent_id == str(task.id) and "owner_requested" not in call.arguments
    record = await db_async(ReceiptRecord.objects.get)(call=call)
    assert record.status == "succeeded"
    report = await db_async(TimelineEntry.objects.get)(kind="reply")
    assert "5" in report.text and "99" not in report.text  # the checker removed the unsupported number
    assert await db_async(ToldFact.objects.filter(entry=report, acknowledged_at__isnull=True).count)() > 0
    # a second report is never stored
    from brain.agent_loop import report_task

    await report_task(task.id)
    assert await db_async(TimelineEntry.objects.filter(kind="reply").count)() == 1


async def test_tool_list_refreshes_between_turns_without_a_restart(make_device: Any, brain: Any, packs: Path) -> None:
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim)
    task = await db_async(agents.delegate)(run.id, "use the new tool")
    script(brain, requires_tool="later__read", when="tool", match="later_answer", reply="all done")
    script(brain, requires_tool="later__read", when="tool", reply="", tool_calls=[{"name": "later__read", "arguments": {}}])
    script(brain, requires_tool="demo__read", forbids_tool="later__read", reply="", tool_calls=[{"name": "demo__read", "arguments": {}}])
    script(brain, match="Background task finished", reply="ok")

    original_complete = __import__("brain.agent_loop", fromlist=["complete"]).complete
    turns = {"n": 0}

    async def tools_version(manager: Any) -> int:
        return manager.tools_version

    async def complete_and_install(messages: Any, **kwargs: Any) -> Any:
        result = await original_complete(messages, **kwargs)
        turns["n"] += 1
        if turns["n"] == 1:  # after the first turn, a new pack appears in the shared host
            before = await runtime.on_host_loop(tools_version)
            write_pack(packs, "later", tools_py=LATER_TOOLS)
            # the host polls the directory every second: wait until it said its tools
            # changed (seen, not timed; the 60 s only bound a failure)
            deadline = time.monotonic() + 60
            while await runtime.on_host_loop(tools_version) == before:
                assert time.monotonic() < deadline, "the shared host never announced the new pack"
                await asyncio.sleep(0.05)
        return result

    import brain.agent_loop as loop_module

    loop_module.complete = complete_and_install
    try:
        assert await execute_agent_task(task.id) == "succeeded"
    finally:
        loop_module.complete = original_complete
    assert await db_async(ToolCall.objects.filter(tool="later__read", decision="allow").exists)()


async def test_milestone_message_is_added_every_twenty_calls(make_device: Any, brain: Any, packs: Path) -> None:
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim)
    await db_async(Run.objects.filter(id=run.id).update)(tool_calls_used=19)
    task = await db_async(agents.delegate)(run.id, "count things")
    script(brain, match="Milestone", reply="Progress: counted.")
    script(brain, requires_tool="demo__read", reply="", tool_calls=[{"name": "demo__read", "arguments": {}}])
    script(brain, match="Background task finished", reply="ok")
    await execute_agent_task(task.id)
    assert any("Milestone: 20 of 120" in (m.get("content") or "") for r in brain.script.requests for m in r["messages"])


async def test_budget_spent_stops_the_subagent(make_device: Any, brain: Any, packs: Path) -> None:
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim)
    await db_async(Run.objects.filter(id=run.id).update)(tool_calls_used=120)
    task = await db_async(agents.delegate)(run.id, "more work")
    script(brain, requires_tool="demo__read", reply="", tool_calls=[{"name": "demo__read", "arguments": {}}])
    script(brain, match="Background task finished", reply="ok")
    await execute_agent_task(task.id)
    stored = await db_async(AgentTask.objects.get)(id=task.id)
    assert "budget" in stored.result and await db_async(ToolCall.objects.count)() == 0


async def test_unreachable_gateway_blocks_before_execution(make_device: Any, brain: Any, packs: Path, settings: Any) -> None:
    from capabilities.client import NOT_EXECUTED, call_tool

    settings.YIMI_GATEWAY_OVER_HTTP = True
    settings.YIMI_INTERNAL_SOCKET = settings.DATA_DIR / "nobody-listens.sock"
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim)
    outcome = await call_tool(str(run.id), "", "workspace__write_file", {"path": "x.txt", "content": "x"})
    assert outcome.model_text == NOT_EXECUTED and not outcome.executed
    assert not (settings.YIMI_WORKSPACE_DIR / "x.txt").exists()


async def test_gateway_lost_after_execution_means_result_not_yet_verified(make_device: Any, brain: Any, packs: Path, settings: Any) -> None:
    from capabilities.client import NOT_VERIFIED, GatewayUnavailable, InProcessTransport, call_tool

    class ReceiptLost(InProcessTransport):
        async def receipt(self, payload: dict[str, Any]) -> dict[str, Any]:
            raise GatewayUnavailable("connection reset")

    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim)
    outcome = await call_tool(str(run.id), "", "workspace__write_file", {"path": "y.txt", "content": "y"}, gateway=ReceiptLost())
    assert outcome.executed and outcome.model_text == NOT_VERIFIED
    assert (settings.YIMI_WORKSPACE_DIR / "y.txt").exists()  # it did run; we just cannot vouch for it
    assert await db_async(ReceiptRecord.objects.count)() == 0


# --- end to end over the websocket ---------------------------------------------------------------


async def test_text_to_delegate_to_workspace_tool_to_checked_reply_acked(make_device: Any, brain: Any, packs: Path, settings: Any) -> None:
    script(brain, match="整理", forbids_tool="workspace__write_file", reply="好，我去整理。", tool_calls=[
        {"name": "delegate", "arguments": {"goal": "把会议纪要写进 notes/meeting.md：明天十点开会"}},
    ])
    script(brain, requires_tool="workspace__write_file", reply="", tool_calls=[
        {"name": "workspace__write_file", "arguments": {"path": "notes/meeting.md", "content": "明天十点开会", "owner_requested": True}},
    ])
    script(brain, when="tool", requires_tool="workspace__write_file", reply="写好了。")
    script(brain, match="Background task finished", reply="纪要已经写进 notes/meeting.md，共十八个字节。")

    sim = await db_async(make_device)()
    comm, _ = await open_socket(sim)
    await comm.send_json_to({"type": "text", "id": "m1", "text": "把今天的会议纪要整理一下"})
    ack = await receive_until(comm, "text.ack")
    first = await receive_until(comm, "reply.done")
    assert first["text"] == "好，我去整理。" and first["reply_to_seq"] == ack["seq"]
    card = await receive_until(comm, "activity", timeout=20)
    assert card["status"] == "succeeded"
    report = await receive_until(comm, "reply.done", timeout=20)
    assert report["reply_to_seq"] == ack["seq"] and "18" in report["text"].replace("十八", "18")
    assert (settings.YIMI_WORKSPACE_DIR / "notes" / "meeting.md").read_text() == "明天十点开会"
    await comm.send_json_to({"type": "ack", "seq": report["seq"], "status": "rendered"})
    await comm.send_json_to({"type": "ping", "id": "p"})
    await receive_until(comm, "pong")
    told = await db_async(lambda: list(ToldFact.objects.filter(entry__seq=report["seq"]).values_list("acknowledged_at", flat=True)))()
    assert told and all(t is not None for t in told)
    kinds = await db_async(lambda: list(TimelineEntry.objects.order_by("seq").values_list("kind", flat=True)))()
    assert kinds == ["utterance", "reply", "reply"]
    await comm.disconnect()


async def test_a_failed_report_turn_still_tells_the_facts_from_templates(make_device: Any, brain: Any, packs: Path) -> None:
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim, "save a note")
    task = await db_async(agents.delegate)(run.id, "write hello into notes/b.txt")
    script(brain, requires_tool="workspace__write_file", reply="", tool_calls=[
        {"name": "workspace__write_file", "arguments": {"path": "notes/b.txt", "content": "hello", "owner_requested": True}},
    ])
    script(brain, when="tool", requires_tool="workspace__write_file", reply="Saved.")
    script(brain, match="Background task finished", status=500)
    assert await execute_agent_task(task.id) == "succeeded"
    report = await db_async(TimelineEntry.objects.get)(kind="reply")
    assert "5" in report.text  # bytes_written, from the fact templates alone
