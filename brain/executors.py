"""The names of the work brain starts, and the coroutine that executes each in this process.

Every kind of work is known by the name of the Celery task that carries it to a worker
(``RUN``, ``AGENT_TASK``, ``CARD_EXECUTION``, payments' ``EXECUTE_PAYMENT_TASK``): with a
broker, ``brain.dispatch`` sends it by that name; without one (the embedded default), and
on a worker's run lane (``brain.run_lane``), the coroutine registered here under that name
executes it. So the code that starts work never imports the code that does it: the
executors (``brain.runner``, ``brain.agent_loop``, ``brain.consent_execution``,
``brain.payment_execution``) import ``brain.dispatch``, and their Celery task modules
(``brain.tasks``, ``brain.execution_tasks``) register them here when they are imported
(``BrainConfig.ready`` imports ``brain.tasks`` in every process). The names are persisted
in queued messages: they never change when a function moves.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

RUN = "brain.tasks.execute_run"
AGENT_TASK = "brain.tasks.execute_agent_task"
CARD_EXECUTION = "consent.tasks.execute_approved"  # its name from before it moved here from consent/

Execute = Callable[..., Coroutine[Any, Any, Any]]

_executors: dict[str, Execute] = {}


def register(task_name: str, execute: Execute) -> None:
    """``execute(*args)`` runs the work the Celery task ``task_name`` carries, in this process."""
    _executors[task_name] = execute


def executor(task_name: str) -> Execute:
    """The coroutine function registered for ``task_name``; ``LookupError`` if none is (its
    task module was never imported in this process)."""
    try:
        return _executors[task_name]
    except KeyError:
        raise LookupError(f"no executor registered for {task_name!r} (brain.tasks registers them)") from None
