"""Delegation and the per-run tool budget: the only code that writes ``AgentTask`` and
``Run.tool_calls_used``.

One budget per run tree: every tool call of the main agent and of every sub-agent,
failed validations included, takes one unit with a conditional UPDATE
(``tool_calls_used < 120``), so concurrent sub-agents can never exceed it together.
At most 3 sub-agents of a run are active at once, and delegation is at most 2 deep.
A delegation that finds the pool full is not dropped: it is created ``synchronous`` and
runs inside its delegator's turn instead of waiting for a free slot. A failed task
gets at most one read-only self-check (``start_self_check``), which may only observe.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from brain import queries
from brain.models import AgentTask, Run
from memory.copies import ForgottenContent, rows_in_chunks
from yimi_project.errors import YimiError
from yimi_project.ids import uuid_or_nil
from yimi_project.infra import statements

ACTIVE = (AgentTask.State.QUEUED, AgentTask.State.RUNNING)


@dataclass(frozen=True)
class BudgetUnit:
    used: int  # the number of this call in the run tree, 1-based

    @property
    def milestone(self) -> bool:
        return self.used % settings.RUN_MILESTONE_EVERY == 0


def consume_budget(run_id: Any) -> BudgetUnit | None:
    """Take one tool call from the run tree's budget; None when it is spent."""
    with transaction.atomic():
        taken = Run.objects.filter(id=run_id, tool_calls_used__lt=settings.RUN_TOOL_CALL_BUDGET).update(
            tool_calls_used=F("tool_calls_used") + 1
        )
        if not taken:
            return None
        used = Run.objects.filter(id=run_id).values_list("tool_calls_used", flat=True).get()
    return BudgetUnit(used)


def delegate(run_id: Any, goal: str, parent: AgentTask | None = None, *, synchronous: bool = False) -> AgentTask:
    """Create a sub-agent task under the run (or under ``parent``).

    Steps: 1. lock the run row, so concurrent delegations of one tree queue; 2. refuse
    beyond depth 2 (``too_deep``) or, for a background task, with 3 sub-agents already
    active (``pool_full``); a ``synchronous`` task runs inside its delegator's turn, so
    it adds no parallel work and is not refused for a full pool; 3. create the task, queued.
    """
    goal = goal.strip()
    if not goal:
        raise YimiError("invalid_request", "a delegation needs a goal")
    depth = parent.depth + 1 if parent is not None else 1
    with transaction.atomic():
        Run.objects.select_for_update().filter(id=run_id).first()
        if depth > settings.MAX_DELEGATION_DEPTH:
            raise YimiError("too_deep", f"delegation is at most {settings.MAX_DELEGATION_DEPTH} levels deep")
        active = AgentTask.objects.filter(run_id=run_id, state__in=ACTIVE).count()
        if active >= settings.MAX_ACTIVE_SUBAGENTS and not synchronous:
            raise YimiError("pool_full", f"{active} sub-agents are already working on this run")
        return AgentTask.objects.create(run_id=run_id, parent=parent, depth=depth, goal=goal[:4000], synchronous=synchronous)


SELF_CHECK_CATEGORIES = frozenset({"observe"})


def start_self_check(task: AgentTask) -> AgentTask | None:
    """The one read-only self-check of a failed task, or None: the task did not fail, is
    itself a self-check, or already has one (a unique constraint keeps it to one)."""
    if task.kind != AgentTask.Kind.TASK:
        return None
    with transaction.atomic():
        fresh = AgentTask.objects.select_for_update().filter(id=task.id).first()
        if fresh is None or fresh.state != AgentTask.State.FAILED or fresh.error_code == "cancelled":
            return None
        if AgentTask.objects.filter(parent=fresh, kind=AgentTask.Kind.SELF_CHECK).exists():
            return None
        goal = (
            "Read-only self-check of a failed task. Do NOT redo the task and do not change anything: "
            "use only read (observe) tools to find out what state things are in now and why it may have failed. "
            f"The task was: {fresh.goal[:2000]}\nIt ended with: {fresh.result[:1000]}"
        )
        return AgentTask.objects.create(
            run_id=fresh.run_id, parent=fresh, depth=fresh.depth + 1, goal=goal,
            kind=AgentTask.Kind.SELF_CHECK, synchronous=True,
        )


def agent_categories(agent_id: str) -> frozenset[str] | None:
    """The gateway's agent limit (``capabilities.authorities.register_agent_limit``): a
    self-check agent may only observe; any other agent is not limited here."""
    kind = AgentTask.objects.filter(id=uuid_or_nil(agent_id)).values_list("kind", flat=True).first()
    return SELF_CHECK_CATEGORIES if kind == AgentTask.Kind.SELF_CHECK else None


def claim_task(task_id: Any) -> AgentTask | None:
    now = timezone.now()
    stale = now - timedelta(seconds=settings.RUN_HEARTBEAT_STALE_SECONDS)
    claimed = (
        AgentTask.objects.filter(id=task_id)
        .filter(Q(state=AgentTask.State.QUEUED) | Q(state=AgentTask.State.RUNNING, heartbeat_at__lt=stale))
        .update(state=AgentTask.State.RUNNING, attempts=F("attempts") + 1, heartbeat_at=now)
    )
    if claimed != 1:
        return None
    return AgentTask.objects.select_related("run", "run__inbound", "run__origin_device").get(id=task_id)


def task_heartbeat(task: AgentTask) -> bool:
    return bool(
        AgentTask.objects.filter(id=task.id, state=AgentTask.State.RUNNING, attempts=task.attempts).update(
            heartbeat_at=timezone.now()
        )
    )


def finish_task(task: AgentTask, *, state: str, result: str, error_code: str = "") -> bool:
    """Close a task we hold. Undelivered steering goes back with the result."""
    with transaction.atomic():
        locked = AgentTask.objects.select_for_update().filter(id=task.id, state=AgentTask.State.RUNNING, attempts=task.attempts).first()
        if locked is None:
            return False
        AgentTask.objects.filter(id=task.id).update(
            state=state, result=result, error_code=error_code, finished_at=timezone.now()
        )
    return True


def steer(run_id: Any, task_id: Any, message: str) -> AgentTask:
    """Queue an owner addition for a working sub-agent (delivered at its next tool-result
    boundary; if it finished first, the addition comes back with its result)."""
    with transaction.atomic():
        task = AgentTask.objects.select_for_update().filter(id=uuid_or_nil(task_id), run__owner_id=_owner_of(run_id)).first()
        if task is None:
            raise YimiError("not_found", "there is no such background task")
        if task.state not in ACTIVE:
            raise YimiError("task_finished", "that background task has already finished")
        task.steer_pending = [*task.steer_pending, message[:2000]]
        task.save(update_fields=["steer_pending"])
        return task


def take_steering(task_id: Any) -> list[str]:
    with transaction.atomic():
        task = AgentTask.objects.select_for_update().get(id=task_id)
        pending = list(task.steer_pending)
        if pending:
            task.steer_delivered = [*task.steer_delivered, *pending]
            task.steer_pending = []
            task.save(update_fields=["steer_pending", "steer_delivered"])
    return pending


def mark_reported(task_id: Any, entry_id: int) -> bool:
    """The follow-up that reports a task happens at most once."""
    return bool(AgentTask.objects.filter(id=task_id, reported_entry=None).update(reported_entry_id=entry_id))


def active_tasks_for_owner(owner_id: int) -> list[AgentTask]:
    """The owner's background tasks still working (depth 1), oldest first; read on every
    main turn, so on PostgreSQL its SELECT is built once per process
    (``brain.queries.active_tasks_sql``); SQLite takes the ORM."""
    if not statements.on_postgresql():
        return list(
            AgentTask.objects.filter(depth=1, kind=AgentTask.Kind.TASK, run__owner_id=owner_id, state__in=ACTIVE).order_by("created_at")
        )
    sql, fields = queries.active_tasks_sql(ACTIVE)
    return statements.fetch_instances(AgentTask, sql, [1, AgentTask.Kind.TASK, owner_id, *ACTIVE], fields)


def run_has_active_agents(run_id: Any) -> bool:
    return AgentTask.objects.filter(run_id=run_id, state__in=ACTIVE).exists()


def tasks_to_recover() -> list[Any]:
    now = timezone.now()
    stale = now - timedelta(seconds=settings.RUN_HEARTBEAT_STALE_SECONDS)
    grace = now - timedelta(seconds=settings.RUN_QUEUED_GRACE_SECONDS)
    return list(
        AgentTask.objects.filter(
            Q(state=AgentTask.State.QUEUED, created_at__lt=grace, depth=1) | Q(state=AgentTask.State.RUNNING, heartbeat_at__lt=stale, depth=1)
        ).values_list("id", flat=True)
    )


def _owner_of(run_id: Any) -> int | None:
    return Run.objects.filter(id=run_id).values_list("owner_id", flat=True).first()


def redact_payload(owner_id: int, content: ForgottenContent) -> dict[str, int]:
    """Redact copies of forgotten memory payloads in the owner's sub-agent tasks — the goal
    the main agent wrote, the result, the owner's steering — written back where something
    changed. Memory's ``forget`` calls this (registered in ``memory.copies``) inside its
    transaction. Returns rows changed per place."""
    changed = 0
    tasks = AgentTask.objects.filter(run__owner_id=owner_id).only("id", "goal", "result", "steer_pending", "steer_delivered")
    for chunk in rows_in_chunks(tasks):
        for task in chunk:
            fields = {
                "goal": content.redact_text(task.goal),
                "result": content.redact_text(task.result),
                "steer_pending": content.redact(task.steer_pending),
                "steer_delivered": content.redact(task.steer_delivered),
            }
            if any(value != getattr(task, name) for name, value in fields.items()):
                AgentTask.objects.filter(id=task.id).update(**fields)
                changed += 1
    return {"agent_tasks": changed}
