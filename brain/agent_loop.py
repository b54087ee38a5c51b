"""The agent loop: the main agent talks and delegates; sub-agents act through packs.

- **Main turn** (``main_turn``): the model sees only conversation tools (``delegate``,
  ``steer``). Its text streams to the device that spoke. Delegating starts a sub-agent
  task and ends the turn: the work happens in the background.
- **Sub-agent** (``execute_agent_task``): the model sees the pack tools of the run's scope
  (read from the pack hosts every turn, so a ``tools/list_changed`` shows up at the next
  turn) and, at depth 1, ``delegate``. Every call goes through the gateway
  (``capabilities.client.call_tool``). Owner additions (``steer``) are delivered at the
  next tool-result boundary. Every 20th call of the run tree adds a milestone message.
- **Follow-up** (``report_task``): when a depth-1 task finishes, one more main-agent turn
  reports the result; the deterministic checker compares it with the task's receipts
  before it leaves, and it is stored at most once per task.

All tool calls of the tree share one budget of 120 (``brain.agents.consume_budget``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings

from brain import agents, reporting
from brain.client import BrainError, Completion, complete
from brain.dispatch import keep_claim
from brain.models import AgentTask, Run
from capabilities.client import ToolOutcome, call_tool
from capabilities.manifest import load_packs, note_listed_tools
from capabilities.mcp_host.runtime import on_host_loop
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

DELEGATED_ACK = "好，我去办，办好了告诉你。"

MAIN_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "delegate",
            "description": (
                "Hand work to a background sub-agent. Every action, even a single tool call, is delegated: "
                "you only talk, decide and delegate. Your turn ends after delegating; the result comes back later."
            ),
            "parameters": {
                "type": "object",
                "properties": {"goal": {"type": "string", "description": "what to achieve, with the owner's own conditions"}},
                "required": ["goal"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "steer",
            "description": "Pass something the owner just added to a background task that is still working.",
            "parameters": {
                "type": "object",
                "properties": {"task_id": {"type": "string"}, "message": {"type": "string"}},
                "required": ["task_id", "message"],
            },
        },
    },
]
SUBAGENT_SYSTEM = (
    "You are a background sub-agent of Yimi, a private assistant. Achieve the goal with the tools; "
    "set owner_requested=true only when the owner explicitly asked for that action. "
    "Tool results are receipts: never claim more than they say. When done, answer with a short summary."
)


def tool_spec(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    parameters = json.loads(json.dumps(schema or {"type": "object"}))
    parameters.setdefault("type", "object")
    parameters.setdefault("properties", {})["owner_requested"] = {
        "type": "boolean",
        "description": "true only if the owner explicitly asked for this action",
    }
    return {"type": "function", "function": {"name": name, "description": description or name, "parameters": parameters}}


def parse_arguments(raw: str) -> dict[str, Any] | None:
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# --- the main turn ------------------------------------------------------------------------------


async def main_turn(run: Run, messages: list[dict[str, Any]], on_text: Callable[[str], Awaitable[None]]) -> tuple[str, list[AgentTask]]:
    """One main-agent turn: returns the reply text and the tasks it delegated, which the
    caller starts once the reply is stored (raises BrainError on failure)."""
    active = await database_sync_to_async(agents.active_tasks_for_owner)(run.owner_id)
    if active and run.scope == "owner":
        listing = "\n".join(f"- {t.id}: {t.goal[:200]}" for t in active)
        messages = [*messages[:-1], {"role": "system", "content": f"Background tasks still working (use steer to add to one):\n{listing}"}, messages[-1]]
    completion = await complete(messages, tools=MAIN_TOOLS, on_text=on_text)
    delegated = await handle_main_tool_calls(run, completion)
    text = completion.text.strip()
    if not text and delegated:
        text = DELEGATED_ACK
        await on_text(text)
    if not text:
        raise BrainError("brain_bad_response", "the brain's answer was empty")
    return text, delegated


async def handle_main_tool_calls(run: Run, completion: Completion) -> list[AgentTask]:
    delegated: list[AgentTask] = []
    for call in completion.tool_calls:
        unit = await database_sync_to_async(agents.consume_budget)(run.id)
        if unit is None:
            log_event("run_budget_spent", run_id=str(run.id))
            break
        args = parse_arguments(call.arguments)
        try:
            if call.name == "delegate" and args is not None:
                task = await database_sync_to_async(agents.delegate)(run.id, str(args.get("goal", "")))
                delegated.append(task)
            elif call.name == "steer" and args is not None:
                await database_sync_to_async(agents.steer)(run.id, args.get("task_id"), str(args.get("message", "")))
            else:
                log_event("main_agent_invalid_call", run_id=str(run.id), tool=call.name[:64])
        except YimiError as exc:
            log_event("main_agent_call_refused", run_id=str(run.id), tool=call.name[:64], code=exc.code)
    return delegated


# --- sub-agents ---------------------------------------------------------------------------------


async def execute_agent_task(task_id: Any) -> str:
    task = await database_sync_to_async(agents.claim_task)(task_id)
    if task is None:
        return "skipped"
    beat = asyncio.ensure_future(keep_claim(lambda: agents.task_heartbeat(task)))
    try:
        state, result, code = AgentTask.State.SUCCEEDED, "", ""
        try:
            result = await subagent_loop(task)
        except BrainError as exc:
            state, result, code = AgentTask.State.FAILED, f"the sub-agent's brain call failed ({exc.code})", exc.code
        except Exception as exc:  # noqa: BLE001 - the owner is told it stopped, never left waiting
            log_event("subagent_crashed", task_id=str(task.id), error=type(exc).__name__)
            state, result, code = AgentTask.State.FAILED, "the sub-agent stopped on an internal error", "internal_error"
    finally:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
    if not await database_sync_to_async(agents.finish_task)(task, state=state, result=result, error_code=code):
        return "skipped"
    await reporting.push_task_card(task.run.owner_id, task, state)
    if task.depth == 1:
        await report_task(task.id)
    return state


async def subagent_loop(task: AgentTask) -> str:
    run = task.run
    scope = run.scope
    messages: list[dict[str, Any]] = [{"role": "system", "content": SUBAGENT_SYSTEM}, {"role": "user", "content": task.goal}]
    while True:
        for addition in await database_sync_to_async(agents.take_steering)(task.id):
            messages.append({"role": "user", "content": f"The owner adds: {addition}"})
        pack_names = [p.name for p in load_packs().packs.values() if scope in p.scopes]
        listed = await _list_pack_tools(pack_names) if pack_names else {}
        tools = [tool_spec(name, t.description or "", dict(t.input_schema)) for name, t in sorted(listed.items())]
        if task.depth < settings.MAX_DELEGATION_DEPTH:
            tools.append(MAIN_TOOLS[0])
        completion = await complete(messages, tools=tools or None)
        if not completion.tool_calls:
            return completion.text.strip() or "(the sub-agent finished without a summary)"
        messages.append(completion.assistant_message())
        milestone_at = 0
        for call in completion.tool_calls:
            unit = await database_sync_to_async(agents.consume_budget)(run.id)
            if unit is None:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "BUDGET SPENT: no tool calls are left for this run."})
                return f"Stopped: the run's budget of {settings.RUN_TOOL_CALL_BUDGET} tool calls is spent."
            if unit.milestone:
                milestone_at = unit.used
            content = await _one_call(task, call.name, parse_arguments(call.arguments), listed)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        if milestone_at:
            messages.append(
                {
                    "role": "user",
                    "content": (
                        f"Milestone: {milestone_at} of {settings.RUN_TOOL_CALL_BUDGET} tool calls used. In one sentence, "
                        f"what progress have you made toward the goal ({task.goal[:200]}) and what is blocking you? "
                        "If you have no concrete next step, change approach or report back."
                    ),
                }
            )


async def _list_pack_tools(pack_names: list[str]) -> dict[str, Any]:
    listed = await on_host_loop(lambda manager: manager.list_tools(pack_names))
    note_listed_tools(listed)  # the gateway's default targets: each tool's required arguments
    return listed


async def _one_call(task: AgentTask, name: str, args: dict[str, Any] | None, listed: dict[str, Any]) -> str:
    if args is None:
        return "INVALID: the arguments are not a JSON object. Not executed."
    if name == "delegate":
        if task.depth >= settings.MAX_DELEGATION_DEPTH:
            return f"REFUSED: delegation is at most {settings.MAX_DELEGATION_DEPTH} levels deep."
        try:
            child = await database_sync_to_async(agents.delegate)(task.run_id, str(args.get("goal", "")), task)
        except YimiError as exc:
            return f"REFUSED ({exc.code}): {exc.message}"
        state = await execute_agent_task(child.id)  # depth 2 runs inside its parent's turn
        result = await database_sync_to_async(lambda: AgentTask.objects.get(id=child.id).result)()
        return f"Sub-agent {state}: {result}"
    if name not in listed:
        return f"UNKNOWN TOOL {name[:64]!r}: not available in this run. Not executed."
    outcome: ToolOutcome = await call_tool(str(task.run_id), str(task.id), name, args)
    if outcome.receipt is not None:
        await reporting.push_receipt_card(task.run.owner_id, task, outcome)
        return await reporting.model_text(task.run.owner_id, outcome)
    return outcome.model_text


# --- the follow-up ---------------------------------------------------------------------------


async def report_task(task_id: Any) -> None:
    """Tell the owner how a finished task went: one follow-up turn, checked against the
    task's receipts, stored and delivered at most once."""
    task = await database_sync_to_async(
        lambda: AgentTask.objects.select_related("run", "run__inbound").get(id=task_id)
    )()
    if task.reported_entry_id is not None:
        return
    report = await reporting.prepare_report(task)
    await reporting.report_turn(
        task.run, report, lambda entry_id: agents.mark_reported(task.id, entry_id),
        context=[{"role": "user", "content": task.run.inbound.text}], event=f"task {task.id}",
    )
