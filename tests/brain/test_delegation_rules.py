"""Delegation never vanishes (pool full → synchronous, depth → said plainly, crash →
failed, failure → one read-only self-check), and what a sub-agent is given: the packs'
skills within a budget, paged tool discovery above 20 tools, a per-turn thinking switch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from brain import agents
from brain.agent_loop import DELEGATED_ACK, execute_agent_task, main_turn
from brain.models import AgentTask, Run
from brain.prompts import SKILL_HEADER, build_messages
from brain.services import accept_utterance
from capabilities.mcp_host import runtime
from capabilities.models import ToolCall
from capabilities.services import CallRequest, decide
from memory.models import TimelineEntry
from tests.brain import test_agent_loop
from tests.conftest import db_async, new_client_id, script, use_brain
from tests.support.gateway_support import manifest, write_pack

pytestmark = pytest.mark.django_db(transaction=True)
packs = test_agent_loop.packs  # the fixture: the workspace and demo packs

WORKSPACE_SKILL_LINE = "A write is verified by reading the file back"




def new_run(sim: Any, text: str = "do things", thinking: bool | None = None) -> Run:
    return Run.objects.select_related("inbound").get(id=accept_utterance(sim.device, new_client_id(), text, thinking=thinking).run_id)


def offered(request: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in request.get("tools") or []}


def sub_requests(brain: Any, goal: str) -> list[dict[str, Any]]:
    return [r for r in brain.script.requests if len(r["messages"]) > 1 and r["messages"][1].get("content") == goal]


async def noop(_: str) -> None:
    return None


# --- pool full: synchronous inside the main turn -----------------------------------------------


async def test_pool_full_runs_the_task_synchronously_inside_the_main_turn(make_device: Any, brain: Any, packs: Path) -> None:
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim, "请帮我查一下答案")
    busy = [await db_async(agents.delegate)(run.id, f"busy {i}") for i in range(3)]
    script(brain, match="查一下", forbids_tool="demo__read", reply="", tool_calls=[{"name": "delegate", "arguments": {"goal": "look up the answer"}}])
    script(brain, match="look up the answer", requires_tool="demo__read", reply="", tool_calls=[{"name": "demo__read", "arguments": {}}])
    script(brain, when="tool", requires_tool="demo__read", reply="The answer is 42.")
    script(brain, match="Background task finished", reply="答案是 42。")

    messages = build_messages("owner", run.inbound.text, [])
    text, delegated = await main_turn(run, messages, noop)

    assert len(delegated) == 1
    task = await db_async(AgentTask.objects.get)(id=delegated[0].id)
    # it already ran, inside the turn, although 3 others were working
    assert task.synchronous and task.state == AgentTask.State.SUCCEEDED and task.result == "The answer is 42."
    assert await db_async(ToolCall.objects.filter(tool="demo__read", agent_id=str(task.id)).exists)()
    assert all(t.state == AgentTask.State.QUEUED for t in [await db_async(AgentTask.objects.get)(id=b.id) for b in busy])
    assert text == DELEGATED_ACK
    # the runner dispatches it after storing the reply: then (and only then) it is reported, once
    assert await db_async(TimelineEntry.objects.filter(kind="reply").count)() == 0
    assert await execute_agent_task(task.id) == "skipped"
    assert await db_async(TimelineEntry.objects.filter(kind="reply").count)() == 1
    await execute_agent_task(task.id)
    assert await db_async(TimelineEntry.objects.filter(kind="reply").count)() == 1


async def test_a_delegation_that_cannot_start_is_said_plainly(make_device: Any, brain: Any, packs: Path) -> None:
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim, "把文件整理一下")
    await db_async(Run.objects.filter(id=run.id).update)(tool_calls_used=120)
    script(brain, match="整理", reply="好，我去整理。", tool_calls=[{"name": "delegate", "arguments": {"goal": "tidy the files"}}])
    said: list[str] = []

    async def collect(delta: str) -> None:
        said.append(delta)

    text, delegated = await main_turn(run, build_messages("owner", run.inbound.text, []), collect)
    assert delegated == [] and await db_async(AgentTask.objects.count)() == 0
    assert "没能开始" in text and "预算" in text and "没能开始" in "".join(said)


# --- depth: the limit is said, and a depth-1 delegation runs inside its parent -----------------


async def test_at_depth_two_no_subagent_starts_and_the_agent_is_told_so(make_device: Any, brain: Any, packs: Path) -> None:
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim)
    first = await db_async(agents.delegate)(run.id, "level one")
    second = await db_async(agents.delegate)(run.id, "level two work", parent=first)
    script(brain, match="level two work", reply="", tool_calls=[{"name": "delegate", "arguments": {"goal": "level three"}}])
    script(brain, when="tool", match="NOT STARTED", reply="I could not hand it on; I did not do level three.")
    assert await execute_agent_task(second.id) == "succeeded"
    requests = sub_requests(brain, "level two work")
    assert requests and all("delegate" not in offered(r) for r in requests)
    tool_results = [m["content"] for m in requests[-1]["messages"] if m["role"] == "tool"]
    assert tool_results and tool_results[0].startswith("NOT STARTED")
    assert await db_async(AgentTask.objects.count)() == 2  # no third level was created
    stored = await db_async(AgentTask.objects.get)(id=second.id)
    assert "did not do level three" in stored.result


async def test_a_subagents_delegation_runs_inside_its_turn_even_when_the_pool_is_full(make_device: Any, brain: Any, packs: Path) -> None:
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim)
    parent = await db_async(agents.delegate)(run.id, "parent goal")
    for i in range(2):
        await db_async(agents.delegate)(run.id, f"busy {i}")
    script(brain, match="parent goal", reply="", tool_calls=[{"name": "delegate", "arguments": {"goal": "child goal"}}])
    script(brain, match="child goal", reply="child done")
    script(brain, when="tool", match="Sub-agent succeeded: child done", reply="parent done")
    script(brain, match="Background task finished", reply="ok")
    assert await execute_agent_task(parent.id) == "succeeded"
    child = await db_async(AgentTask.objects.get)(goal="child goal")
    assert child.depth == 2 and child.synchronous and child.state == AgentTask.State.SUCCEEDED
    assert (await db_async(AgentTask.objects.get)(id=parent.id)).result == "parent done"


# --- crashes and failures -------------------------------------------------------------------------


async def test_a_crashed_subagent_is_reported_as_failed(make_device: Any, brain: Any, packs: Path, monkeypatch: Any) -> None:
    import brain.agent_loop as loop_module

    def packs_gone() -> Any:
        raise RuntimeError("the packs directory vanished")

    monkeypatch.setattr(loop_module, "load_packs", packs_gone)  # a fault in a dependency, not in the loop
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim)
    task = await db_async(agents.delegate)(run.id, "something that will crash")
    script(brain, match="Background task finished", reply="这件事没办成，出了内部错误。")
    assert await execute_agent_task(task.id) == AgentTask.State.FAILED
    stored = await db_async(AgentTask.objects.get)(id=task.id)
    assert stored.state == AgentTask.State.FAILED and stored.error_code == "internal_error"
    report_requests = [r for r in brain.script.requests if "Background task finished" in (r["messages"][-1].get("content") or "")]
    assert len(report_requests) == 1 and "Sub-agent state: failed" in report_requests[0]["messages"][-1]["content"]
    assert stored.reported_entry_id is not None


async def test_a_failed_task_gets_exactly_one_read_only_self_check_and_its_finding_is_reported(make_device: Any, brain: Any, packs: Path) -> None:
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim)
    goal = "write the report into notes/r.md"
    task = await db_async(agents.delegate)(run.id, goal)
    script(brain, match="Read-only self-check", requires_tool="demo__read", reply="", tool_calls=[
        {"name": "demo__read", "arguments": {}},
        {"name": "workspace__write_file", "arguments": {"path": "notes/r.md", "content": "x"}},
        {"name": "demo__act", "arguments": {"action": "post"}},
    ])
    script(brain, when="tool", reply="Found: the brain was unavailable; nothing was written.")
    script(brain, match="Background task finished", reply="没写成：大脑暂时不可用，我检查过，什么都没写。")
    script(brain, match="^write the report", status=500)  # the task's own brain call fails

    assert await execute_agent_task(task.id) == AgentTask.State.FAILED

    checks = await db_async(lambda: list(AgentTask.objects.filter(kind=AgentTask.Kind.SELF_CHECK)))()
    assert len(checks) == 1 and checks[0].parent_id == task.id and checks[0].state == AgentTask.State.SUCCEEDED
    check_requests = [r for r in brain.script.requests if "Read-only self-check" in (r["messages"][1].get("content") or "")]
    assert check_requests
    for request in check_requests:  # only observe tools are offered, and no delegation
        assert offered(request) <= {"demo__read", "workspace__read_file", "workspace__list_files"}
    calls = await db_async(lambda: list(ToolCall.objects.values_list("tool", "agent_id")))()
    assert calls == [("demo__read", str(checks[0].id))]  # the others were never executed
    assert not (packs.parent / "workspace" / "notes" / "r.md").exists()
    # the task was not re-run: its goal was asked of the brain once
    assert len(sub_requests(brain, goal)) == 1
    report_requests = [r for r in brain.script.requests if "Background task finished" in (r["messages"][-1].get("content") or "")]
    assert len(report_requests) == 1
    assert "the brain was unavailable; nothing was written" in report_requests[0]["messages"][-1]["content"]
    stored = await db_async(AgentTask.objects.get)(id=task.id)
    assert stored.reported_entry_id is not None
    # never a second self-check
    assert await db_async(agents.start_self_check)(stored) is None
    await execute_agent_task(task.id)
    assert await db_async(AgentTask.objects.filter(kind=AgentTask.Kind.SELF_CHECK).count)() == 1


def test_the_gateway_lets_a_self_check_agent_only_observe(make_device: Any, packs: Path) -> None:
    run = new_run(make_device())
    task = agents.delegate(run.id, "failing work")
    AgentTask.objects.filter(id=task.id).update(state=AgentTask.State.FAILED, error_code="brain_error")
    check = agents.start_self_check(AgentTask.objects.get(id=task.id))
    assert check is not None
    assert agents.start_self_check(AgentTask.objects.get(id=task.id)) is None
    agent = str(check.id)
    assert decide(CallRequest(str(run.id), "demo__read", {}, agent)).decision == "allow"
    assert decide(CallRequest(str(run.id), "demo__act", {"action": "look"}, agent)).decision == "allow"
    for tool, args in [("demo__note", {"text": "x"}), ("demo__act", {"action": "post"}), ("workspace__write_file", {"path": "a", "content": "b"})]:
        refused = decide(CallRequest(str(run.id), tool, args, agent))
        assert (refused.decision, refused.code) == ("block", "agent_read_only"), tool
    # an ordinary sub-agent is not limited by this rule
    assert decide(CallRequest(str(run.id), "demo__note", {"text": "y"}, str(task.id))).code != "agent_read_only"


def test_a_task_that_did_not_fail_or_was_cancelled_gets_no_self_check(make_device: Any) -> None:
    run = new_run(make_device())
    ok = agents.delegate(run.id, "fine")
    AgentTask.objects.filter(id=ok.id).update(state=AgentTask.State.SUCCEEDED)
    assert agents.start_self_check(AgentTask.objects.get(id=ok.id)) is None
    cancelled = agents.delegate(run.id, "stopped by the owner")
    AgentTask.objects.filter(id=cancelled.id).update(state=AgentTask.State.FAILED, error_code="cancelled")
    assert agents.start_self_check(AgentTask.objects.get(id=cancelled.id)) is None


# --- skills ----------------------------------------------------------------------------------------


async def test_each_packs_skill_reaches_the_subagent_within_the_budget(make_device: Any, brain: Any, packs: Path, settings: Any) -> None:
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim)
    task = await db_async(agents.delegate)(run.id, "use the skills")
    script(brain, match="use the skills", reply="done")
    script(brain, match="Background task finished", reply="ok")
    await execute_agent_task(task.id)
    system = sub_requests(brain, "use the skills")[0]["messages"][0]["content"]
    assert WORKSPACE_SKILL_LINE in system and "## Skill of pack demo" in system

    settings.YIMI_SKILLS_PROMPT_CHARS = 120
    task = await db_async(agents.delegate)(run.id, "use fewer skills")
    script(brain, match="use fewer skills", reply="done")
    await execute_agent_task(task.id)
    system = sub_requests(brain, "use fewer skills")[0]["messages"][0]["content"]
    skills = system[system.index(SKILL_HEADER) + len(SKILL_HEADER) :]
    assert len(skills) <= 120 + 2 and "skills budget reached" in skills
    assert WORKSPACE_SKILL_LINE not in system


# --- paged tool discovery ---------------------------------------------------------------------------


def many_tools_pack(packs_dir: Path, count: int) -> None:
    lines = ["from capabilities.packkit import ToolRegistry, receipt, value", "", "TOOLS = ToolRegistry()", ""]
    for i in range(count):
        lines += [
            f'@TOOLS("Look at thing {i:02d}.", {{"type": "object", "properties": {{}}}})',
            f"def look{i:02d}(args):",
            f'    return receipt("succeeded", values=[value("thing", {i}, "unit", "many")])',
            "",
        ]
    data = manifest("many")
    data["extensions"]["ai.yimi.capability"]["tools"] = {f"look{i:02d}": {"effect": "observe"} for i in range(count)}
    write_pack(packs_dir, "many", data=data, tools_py="\n".join(lines))


async def test_more_than_twenty_tools_are_found_page_by_page(make_device: Any, brain: Any, packs: Path) -> None:
    many_tools_pack(packs, 30)  # with demo's 3 and workspace's, well above 20
    runtime.reset_for_tests()
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim)
    task = await db_async(agents.delegate)(run.id, "find and look")
    script(brain, match="find and look", requires_tool="find_tools", reply="", tool_calls=[{"name": "find_tools", "arguments": {"query": "many__"}}])
    script(brain, when="tool", match='"next_offset": 20', reply="", tool_calls=[{"name": "find_tools", "arguments": {"query": "many__", "offset": 20, "limit": 500}}])
    script(brain, when="tool", match='"next_offset": null', requires_tool="many__look25", reply="", tool_calls=[{"name": "many__look25", "arguments": {}}])
    script(brain, when="tool", reply="looked")
    script(brain, match="Background task finished", reply="ok")
    assert await execute_agent_task(task.id) == "succeeded"

    requests = sub_requests(brain, "find and look")
    first = offered(requests[0])
    assert "find_tools" in first and not any(n.startswith("many__") for n in first)
    pages = [json.loads(m["content"]) for m in requests[-1]["messages"] if m["role"] == "tool" and m["content"].startswith('{"tools"')]
    assert [len(p["tools"]) for p in pages] == [20, 10] and [p["next_offset"] for p in pages] == [20, None]
    assert pages[0]["total"] == 30
    assert {f"many__look{i:02d}" for i in range(30)} <= offered(requests[-1])
    assert await db_async(ToolCall.objects.filter(tool="many__look25", decision="allow").exists)()


async def test_find_tools_pages_hold_at_most_fifty(make_device: Any, brain: Any, packs: Path) -> None:
    many_tools_pack(packs, 60)
    runtime.reset_for_tests()
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim)
    task = await db_async(agents.delegate)(run.id, "list everything")
    script(brain, match="list everything", requires_tool="find_tools", reply="", tool_calls=[{"name": "find_tools", "arguments": {"limit": 1000}}])
    script(brain, when="tool", reply="listed")
    script(brain, match="Background task finished", reply="ok")
    await execute_agent_task(task.id)
    tool_message = next(m for m in sub_requests(brain, "list everything")[-1]["messages"] if m["role"] == "tool")
    page = json.loads(tool_message["content"])
    assert len(page["tools"]) == 50 and page["next_offset"] == 50


async def test_twenty_tools_or_fewer_are_all_offered_without_discovery(make_device: Any, brain: Any, packs: Path) -> None:
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim)
    task = await db_async(agents.delegate)(run.id, "few tools")
    script(brain, match="few tools", reply="done")
    script(brain, match="Background task finished", reply="ok")
    await execute_agent_task(task.id)
    names = offered(sub_requests(brain, "few tools")[0])
    assert "find_tools" not in names and {"demo__read", "demo__note", "workspace__write_file"} <= names


# --- per-turn thinking ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "text", "front", "sent", "recorded"),
    [
        ("enable_thinking", "想清楚再回答：周末去哪儿？", None, True, True),
        ("enable_thinking", "周末去哪儿？", None, False, False),
        ("reasoning_effort", "Please think carefully: which flight?", None, "high", True),
        ("enable_thinking", "想清楚再回答", False, False, False),  # the front's field wins
        ("reasoning_effort", "hi", True, "high", True),
    ],
)
async def test_the_thinking_switch_is_decided_per_turn_sent_and_recorded(
    make_device: Any, brain: Any, settings: Any, field: str, text: str, front: bool | None, sent: Any, recorded: bool
) -> None:
    await db_async(use_brain)(brain.base_url, thinking_field=field)
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim, text, front)
    script(brain, reply="好的。")
    await main_turn(run, build_messages("owner", text, []), noop)
    request = brain.script.requests[-1]
    assert request[field] == sent
    assert (await db_async(Run.objects.get)(id=run.id)).thinking is recorded


async def test_no_thinking_field_is_sent_when_none_is_configured(make_device: Any, brain: Any, settings: Any) -> None:
    await db_async(use_brain)(brain.base_url, thinking_field="")
    sim = await db_async(make_device)()
    run = await db_async(new_run)(sim, "想清楚再回答")
    script(brain, reply="好的。")
    await main_turn(run, build_messages("owner", run.inbound.text, []), noop)
    assert "enable_thinking" not in brain.script.requests[-1] and "reasoning_effort" not in brain.script.requests[-1]
    assert (await db_async(Run.objects.get)(id=run.id)).thinking is True
