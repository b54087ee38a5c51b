"""The agent loop: the main agent talks and delegates; sub-agents act through packs.

- **Main turn** (``main_turn``): the model sees only conversation tools (``delegate``,
  ``steer``). Its text streams to the device that spoke. Delegating starts a sub-agent
  task and ends the turn: the work happens in the background. When 3 sub-agents already
  work, the task runs synchronously inside the main turn instead (its report follows the
  reply); a delegation that cannot start at all is said plainly, never acknowledged.
  The turn's thinking switch is decided per turn (``prompts.decide_thinking``), sent to
  the brain and recorded on the run.
- **Sub-agent** (``execute_agent_task``): the model sees the pack tools of the run's scope
  (read from the pack hosts every turn, so a ``tools/list_changed`` shows up at the next
  turn) and, at depth 1, ``delegate`` (its child runs inside its turn); above 20 tools they
  are found page by page with ``find_tools``; the SKILL.md of each pack it can use is in
  its system prompt, within ``YIMI_SKILLS_PROMPT_CHARS``. Every call goes through the gateway
  (``capabilities.client.call_tool``). Owner additions (``steer``) are delivered at the
  next tool-result boundary. Every 20th call of the run tree adds a milestone message.
- **Follow-up** (``report_task``): when a depth-1 task finishes, one more main-agent turn
  reports the result; the deterministic checker compares it with the task's receipts
  before it leaves, and it is stored at most once per task. A failed task first gets one
  read-only self-check (observe tools only, also enforced by the gateway); its finding is
  part of the report, and the task itself is never re-run.

All tool calls of the tree share one budget of 120 (``brain.agents.consume_budget``).
Every request of a run's tree uses the model roles pinned when the run started
(``run_roles``, ``llm.roles.for_run``): the main turn and reports ``brain``, sub-agents
``delegation``; a change applied meanwhile takes effect for the next run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings

from brain import agents, reporting, services, trace
from brain.dispatch import keep_claim
from brain.models import AgentTask, Run
from brain.prompts import decide_thinking, skills_block
from capabilities.client import ToolOutcome, call_tool
from capabilities.manifest import PackSet, load_packs, note_listed_tools
from capabilities.mcp_host.runtime import on_host_loop
from llm import roles
from llm.client import BrainError, Completion, complete
from llm.usage import CallContext
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

DELEGATED_ACK = "好，我去办，办好了告诉你。"
NOT_STARTED = "这件事没能开始（{reason}），我没有去办。"
NOT_STARTED_REASONS = {
    "budget": "这次的工具调用预算已经用完",
    "invalid_request": "没有说清要办什么",
}
TOOL_PAGE = 20  # above this many tools a sub-agent finds them page by page
TOOL_PAGE_MAX = 50

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
SELF_CHECK_SYSTEM = (
    "You are Yimi's read-only self-check. A background task failed. Do not redo it and do not change anything: "
    "you only have read (observe) tools. Look at the current state, then answer with a short finding: "
    "what is true now, and what probably went wrong."
)
FIND_TOOLS = {
    "type": "function",
    "function": {
        "name": "find_tools",
        "description": (
            f"Find the tools you can use (there are too many to list at once): filter by a word in the name or "
            f"description; {TOOL_PAGE} a page by default, at most {TOOL_PAGE_MAX}. A non-null next_offset means "
            "there is another page. Tools you found are offered to you from your next step on."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "offset": {"type": "integer", "minimum": 0},
                "limit": {"type": "integer", "minimum": 1, "maximum": TOOL_PAGE_MAX},
            },
        },
    },
}


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


async def run_roles(run_id: Any) -> roles.RunRoles:
    """The model roles of ``run_id``'s tree, pinned at its start; unusable settings (a role
    not configured, the master key missing, a key that does not decrypt) end the turn like
    any failed brain call, with an honest notice."""
    try:
        return await database_sync_to_async(roles.for_run)(run_id)
    except YimiError as exc:
        raise roles_unusable(run_id, exc) from None


def roles_unusable(run_id: Any, exc: YimiError) -> BrainError:
    """The failed brain call that model settings which cannot be used amount to (logged)."""
    log_event("model_settings_unusable", run_id=str(run_id), code=exc.code)
    return BrainError("brain_not_configured", f"the model settings cannot be used ({exc.code})")


def turn_context(run: Run, *, tasks_working: bool = True) -> tuple[list[AgentTask], bool]:
    """What a main turn reads besides its prompt (synchronous: the runner reads it in its
    claim's database trip): the owner's background tasks and the turn's thinking switch.
    ``tasks_working=False``: the caller has just read that none is working (the claim)."""
    return agents.active_tasks_for_owner(run.owner_id) if tasks_working else [], _turn_thinking(run)


async def main_turn(
    run: Run, messages: list[dict[str, Any]], on_text: Callable[[str], Awaitable[None]], *, run_models: roles.RunRoles | None = None,
    active: list[AgentTask] | None = None, thinking: bool | None = None, usage_for: CallContext | None = None,
) -> tuple[str, list[AgentTask]]:
    """One main-agent turn with ``run_models.brain`` (the run's pinned roles; read here when
    not given): returns the reply text and the tasks it delegated, which the caller starts
    once the reply is stored (raises BrainError on failure). ``active`` and ``thinking``:
    ``turn_context`` when the caller has read it already; read here when not given.
    ``usage_for``: the call's usage context (``CallContext(run.id)`` when not given)."""
    if run_models is None:
        run_models = await run_roles(run.id)
    if active is None or thinking is None:
        active, thinking = await database_sync_to_async(turn_context)(run)
    if active and run.scope == "owner":
        listing = "\n".join(f"- {t.id}: {t.goal[:200]}" for t in active)
        messages = [*messages[:-1], {"role": "system", "content": f"Background tasks still working (use steer to add to one):\n{listing}"}, messages[-1]]

    async def first_token(delta: str) -> None:  # the trace's first_token (brain.trace)
        trace.mark(run, "first_token")
        await on_text(delta)

    trace.mark(run, "brain_request")
    completion = await complete(messages, tools=MAIN_TOOLS, on_text=first_token, thinking=thinking, role_settings=run_models.brain,
                                usage_for=usage_for or CallContext(run.id))
    not_started: list[str] = []
    delegated = await handle_main_tool_calls(run, completion, not_started)
    text = completion.text.strip()
    if not text and delegated:
        text = DELEGATED_ACK
        await on_text(text)
    if not_started:  # never let "I'll do it" stand for work that was not started
        honest = NOT_STARTED.format(reason="；".join(dict.fromkeys(not_started)))
        await on_text(honest)
        text = f"{text}\n{honest}" if text else honest
    if not text:
        raise BrainError("brain_bad_response", "the brain's answer was empty")
    return text, delegated


def _turn_thinking(run: Run) -> bool:
    """This turn's thinking switch: the front's ``thinking`` field when it sent one (stored
    on the run at admission), else what the owner asked for; recorded on the run
    (``brain.services.record_thinking``)."""
    thinking = decide_thinking(run.inbound.text, run.thinking)
    if run.thinking is None:
        services.record_thinking(run.id, thinking)
        run.thinking = thinking
    return thinking


async def handle_main_tool_calls(run: Run, completion: Completion, not_started: list[str] | None = None) -> list[AgentTask]:
    """Start what the main agent delegated. A delegation that finds the pool full runs
    synchronously here, inside the main turn; one that cannot start is added to
    ``not_started`` (the reason the owner is told)."""
    delegated: list[AgentTask] = []
    missed = not_started if not_started is not None else []
    for index, call in enumerate(completion.tool_calls):
        unit = await database_sync_to_async(agents.consume_budget)(run.id)
        if unit is None:
            log_event("run_budget_spent", run_id=str(run.id))
            if any(c.name == "delegate" for c in completion.tool_calls[index:]):
                missed.append(NOT_STARTED_REASONS["budget"])
            break
        args = parse_arguments(call.arguments)
        try:
            if call.name == "delegate" and args is not None:
                delegated.append(await _start_from_main(run, str(args.get("goal", ""))))
            elif call.name == "steer" and args is not None:
                await database_sync_to_async(agents.steer)(run.id, args.get("task_id"), str(args.get("message", "")))
            else:
                log_event("main_agent_invalid_call", run_id=str(run.id), tool=call.name[:64])
                if call.name == "delegate":
                    missed.append(NOT_STARTED_REASONS["invalid_request"])
        except YimiError as exc:
            log_event("main_agent_call_refused", run_id=str(run.id), tool=call.name[:64], code=exc.code)
            if call.name == "delegate":
                missed.append(NOT_STARTED_REASONS.get(exc.code, exc.message))
    return delegated


async def _start_from_main(run: Run, goal: str) -> AgentTask:
    try:
        return await database_sync_to_async(agents.delegate)(run.id, goal)
    except YimiError as exc:
        if exc.code != "pool_full":
            raise
    # The pool is full: the task runs now, inside this turn (a synchronous delegation). Its report
    # comes when the runner dispatches it after the reply is stored.
    task = await database_sync_to_async(agents.delegate)(run.id, goal, synchronous=True)
    log_event("delegation_synchronous", run_id=str(run.id), task_id=str(task.id))
    await execute_agent_task(task.id, report=False)
    return task


# --- sub-agents ---------------------------------------------------------------------------------


async def execute_agent_task(task_id: Any, *, report: bool = True) -> str:
    task = await database_sync_to_async(agents.claim_task)(task_id)
    if task is None:
        if report:
            await _report_if_ran_synchronously(task_id)
        return "skipped"
    beat = asyncio.ensure_future(keep_claim(lambda: agents.task_heartbeat(task)))
    try:
        state, result, code = AgentTask.State.SUCCEEDED, "", ""
        try:
            result = await subagent_loop(task, (await run_roles(task.run_id)).delegation)
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
    if state == AgentTask.State.FAILED:
        await _self_check(task)
    if task.depth == 1 and task.kind == AgentTask.Kind.TASK and report:
        await report_task(task.id)
    return state


async def _self_check(task: AgentTask) -> None:
    """One read-only self-check of a failed task (never a re-run of it)."""
    check = await database_sync_to_async(agents.start_self_check)(task)
    if check is None:
        return
    log_event("self_check_started", task_id=str(task.id), check_id=str(check.id))
    await execute_agent_task(check.id, report=False)


async def _report_if_ran_synchronously(task_id: Any) -> None:
    """A task that ran inside the main turn (pool full) is reported once the runner
    dispatches it, after the main reply was stored."""
    finished = (AgentTask.State.SUCCEEDED, AgentTask.State.FAILED)
    due = await database_sync_to_async(
        AgentTask.objects.filter(
            id=task_id, synchronous=True, depth=1, kind=AgentTask.Kind.TASK, state__in=finished, reported_entry=None
        ).exists
    )()
    if due:
        await report_task(task_id)


async def subagent_loop(task: AgentTask, role_settings: roles.RoleSettings) -> str:
    run = task.run
    scope = run.scope
    self_check = task.kind == AgentTask.Kind.SELF_CHECK
    packs = load_packs()
    pack_names = [p.name for p in packs.packs.values() if scope in p.scopes]
    system = SELF_CHECK_SYSTEM if self_check else SUBAGENT_SYSTEM
    skills = skills_block([packs.packs[n] for n in sorted(pack_names)], settings.YIMI_SKILLS_PROMPT_CHARS)
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"{system}\n\n{skills}" if skills else system}, {"role": "user", "content": task.goal}]
    found: set[str] = set()  # tools found with find_tools (when they are paged)
    while True:
        for addition in await database_sync_to_async(agents.take_steering)(task.id):
            messages.append({"role": "user", "content": f"The owner adds: {addition}"})
        packs = load_packs()
        pack_names = [p.name for p in packs.packs.values() if scope in p.scopes]
        listed = await _list_pack_tools(pack_names) if pack_names else {}
        if self_check:  # observe tools only (the gateway refuses anything else for this agent too)
            listed = {name: t for name, t in listed.items() if _static_category(packs, name) == "observe"}
        paged = len(listed) > TOOL_PAGE
        offered = sorted(n for n in listed if n in found) if paged else sorted(listed)
        tools = [tool_spec(name, listed[name].description or "", dict(listed[name].input_schema)) for name in offered]
        if paged:
            tools.insert(0, FIND_TOOLS)
        if task.depth < settings.MAX_DELEGATION_DEPTH and not self_check:
            tools.append(MAIN_TOOLS[0])
        completion = await complete(messages, tools=tools or None, role_settings=role_settings, usage_for=CallContext(run.id, task.id))
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
            args = parse_arguments(call.arguments)
            if call.name == "find_tools" and paged and args is not None:
                content = _find_tools(listed, args, found)
            else:
                content = await _one_call(task, call.name, args, listed)
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


def _static_category(packs: PackSet, name: str) -> str | None:
    """A tool's category when it does not depend on the arguments, else None."""
    decl = packs.tool(name)
    return decl.spec.get("effect") if decl is not None else None


def _find_tools(listed: dict[str, Any], args: dict[str, Any], found: set[str]) -> str:
    """One page of the tools that match ``query``; the tools on it are offered from the
    next step on."""
    query = str(args.get("query") or "").strip().lower()
    try:
        offset = max(int(args.get("offset") or 0), 0)
        limit = min(max(int(args.get("limit") or TOOL_PAGE), 1), TOOL_PAGE_MAX)
    except (TypeError, ValueError):
        return "INVALID: offset and limit must be integers. Not executed."
    names = [n for n, t in sorted(listed.items()) if not query or query in n.lower() or query in (t.description or "").lower()]
    page = names[offset : offset + limit]
    found.update(page)
    nxt = offset + limit if offset + limit < len(names) else None
    tools = [{"name": n, "description": listed[n].description or "", "parameters": dict(listed[n].input_schema)} for n in page]
    return json.dumps({"tools": tools, "total": len(names), "next_offset": nxt}, ensure_ascii=False)


async def _list_pack_tools(pack_names: list[str]) -> dict[str, Any]:
    listed = await on_host_loop(lambda manager: manager.list_tools(pack_names))
    note_listed_tools(listed)  # the gateway's default targets: each tool's required arguments
    return listed


async def _one_call(task: AgentTask, name: str, args: dict[str, Any] | None, listed: dict[str, Any]) -> str:
    if args is None:
        return "INVALID: the arguments are not a JSON object. Not executed."
    if name == "delegate":
        if task.depth >= settings.MAX_DELEGATION_DEPTH or task.kind != AgentTask.Kind.TASK:
            return (
                f"NOT STARTED: delegation is at most {settings.MAX_DELEGATION_DEPTH} levels deep, so no sub-agent was started. "
                "Do this part yourself with your own tools, or say plainly in your summary that it was not done."
            )
        try:  # the child runs inside this turn, so a full pool does not stop it
            child = await database_sync_to_async(agents.delegate)(task.run_id, str(args.get("goal", "")), task, synchronous=True)
        except YimiError as exc:
            return f"NOT STARTED ({exc.code}): {exc.message}. Do it yourself, or say plainly that it was not done."
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
    check = await database_sync_to_async(
        lambda: AgentTask.objects.filter(parent_id=task.id, kind=AgentTask.Kind.SELF_CHECK).first()
    )()
    if check is not None:
        report.prompt += (
            f"\nThe task failed and was NOT re-run. A read-only self-check looked at the current state "
            f"({check.state}); it found: {check.result}"
        )
    await reporting.report_turn(
        task.run, report, lambda entry_id: agents.mark_reported(task.id, entry_id),
        context=[{"role": "user", "content": task.run.inbound.text}], event=f"task {task.id}",
    )
