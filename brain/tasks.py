"""The run core's Celery tasks (Celery's autodiscovery imports this module on a worker;
``BrainConfig.ready`` imports it in every process): a run, a sub-agent task, beat's run
recovery and the dispatch probe, each under the name messages already queued carry. Each hands its coroutine to the worker's one event loop
(``brain.worker.on_worker_loop``). Here the executors are registered by those names with
``brain.executors``, so ``brain.dispatch`` and the run lane start them without importing
them; the Celery tasks of card executions and payments (``brain.execution_tasks``) and
companion's call summary (kept under the name ``brain.tasks.summarize_call``) are imported at
the end, to register them in every process as well (llm's tasks: ``LlmConfig.ready``).
"""

from __future__ import annotations

import time

from celery import shared_task
from django.conf import settings

from brain import executors
from brain.agent_loop import execute_agent_task
from brain.recovery import recover_runs
from brain.runner import execute_run
from brain.worker import on_worker_loop

executors.register(executors.RUN, execute_run)
executors.register(executors.AGENT_TASK, execute_agent_task)


@shared_task(name=executors.RUN, acks_late=True)
def execute_run_task(run_id: str, stages: dict[str, float] | None = None) -> str:
    """``stages``: trace stages noted before the run reached the worker (``queued``)."""
    return on_worker_loop(execute_run(run_id, stages=stages))


@shared_task(name="brain.tasks.probe_dispatch")
def probe_dispatch_task(reply_key: str) -> None:
    """The dispatch floor (bench/roundtrip.py): does nothing but tell the publisher, on
    Redis, when a worker started it (``time.time()`` in ms, taken first), so publish →
    pickup is Celery's own cost on this broker, without any run work."""
    started_ms = time.time() * 1000
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=10)
    try:
        client.rpush(reply_key, repr(started_ms))
        client.expire(reply_key, 300)
    finally:
        client.close()


@shared_task(name=executors.AGENT_TASK, acks_late=True)
def execute_agent_task_task(task_id: str) -> str:
    return on_worker_loop(execute_agent_task(task_id))


@shared_task(name="brain.tasks.sweep_runs")
def sweep_runs() -> tuple[int, int]:
    return on_worker_loop(recover_runs())


from brain.execution_tasks import execute_approved_task, execute_payment_task  # noqa: E402,F401  (registers them)
from companion.tasks import summarize_call_task  # noqa: E402,F401  (registers brain.tasks.summarize_call)
