"""The run lane: how a queued run reaches a worker without a Celery message (issue 14).

A run is the one task on the round trip a person waits for, and Celery's way of handing it
over (kombu's message envelope, the reserved-message hash, the late ack's pipeline, the
worker's trace wrapper) cost the worker about as much CPU as the run's own database work,
for nothing a run needs: a run's state lives in its row, not in its message.

So a run is queued as one Redis list entry, ``[run id, trace stages]``, pushed by the web
process right after the admission commits (``push``; ``brain.dispatch.publish_run``). Every
worker process serves the lane on its run loop (``serve``, started when the worker is ready,
``brain.apps``): it pops an entry only while it has a free run slot (``YIMI_WORKER_RUNS``),
so a warm worker with nothing to do takes the run at once, and a busy one leaves it on the
list for the next free slot, on this worker or another. The lane executes a run with the
executor registered under the run task's name (``brain.executors.RUN``): it never imports
the runner.

What Celery's late ack gave, the run's row gives: a run is claimed by a compare-and-set and
kept by its heartbeat (``brain.services``). An entry popped by a worker that dies before it
claims the run is lost from the list; the run is still ``queued``, so the recovery sweep
(``brain.recovery``) puts it back once its entry is older than the sweep interval, as it
does for a lost Celery message. The sweep reads the lane with the Celery queue, in one
Redis transaction, so a run still waiting on the lane is never sent twice.

The blocking pop waits ``LANE_BLOCK_SECONDS`` (5 s) on a connection whose read timeout is
``LANE_READ_MARGIN_SECONDS`` (5 s) longer, so an idle lane never trips its client timeout
(the channel layer's lesson; each empty pop just blocks again), while a connection that
went silent is given up within 10 s and made again.

Kept on its CPU: 23% less per text than a Celery run task with late acks and prefetch 1,
re-measured in issue 36 (docs/decisions/2026-12-03-run-lane.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio as aredis
from django.conf import settings

from brain import executors
from brain.worker import in_own_context, worker_loop
from yimi_project.celery import app
from yimi_project.logs import log_event

LANE_BLOCK_SECONDS = 5  # one blocking pop
# The pop's answer is awaited this much longer than the pop blocks (the connection's read
# timeout is the sum): a connection that went silent (a half-open TCP connection, a Redis
# that hangs) is given up and made again, instead of holding the lane, and every run it
# would have taken, until the process restarts. Longer than the block, so an idle pop never
# times out (the 5 s read timeout that once closed every websocket).
LANE_READ_MARGIN_SECONDS = 5.0
LANE_SUFFIX = ".runs"
RETRY_SECONDS = 1.0  # after Redis refused or dropped the connection

Execute = Callable[[str, dict[str, float]], Awaitable[Any]]


def lane_key() -> str:
    """The lane's Redis key: beside the Celery queue this process publishes to, under the
    same key prefix (``CELERY_TASK_DEFAULT_QUEUE``, kombu's ``global_keyprefix``), so an
    instance's runs never reach another instance's workers."""
    prefix = (app.conf.broker_transport_options or {}).get("global_keyprefix", "") or ""
    return f"{prefix}{app.conf.task_default_queue}{LANE_SUFFIX}"


def broker_url() -> str:
    return str(app.conf.broker_url)


_clients: dict[str, redis.Redis] = {}
_clients_lock = threading.Lock()


def _client(url: str) -> redis.Redis:
    """One client per process and URL: redis-py's connection pool is thread-safe, and every
    admission thread of the web process pushes through it."""
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            client = _clients[url] = redis.Redis.from_url(url, socket_timeout=10, health_check_interval=30)
        return client


def push(run_id: Any, stages: dict[str, float]) -> None:
    """Queue a run on the lane (synchronous: the admission's database thread calls it after
    the commit). Raises ``redis.RedisError`` if Redis is unreachable; the run is stored and
    the recovery sweep sends it once Redis is back."""
    _client(broker_url()).lpush(lane_key(), json.dumps([str(run_id), stages]))


def waiting(client: redis.client.Pipeline) -> None:
    """Queue the read of every entry on the lane into ``client``'s transaction (the recovery
    sweep reads the lane and the Celery queue together)."""
    client.lrange(lane_key(), 0, -1)


def run_ids(entries: list[bytes]) -> set[str]:
    """The run ids of lane entries read by ``waiting``; malformed entries are skipped."""
    ids: set[str] = set()
    for raw in entries:
        parsed = _parse(raw)
        if parsed is not None:
            ids.add(parsed[0])
    return ids


def _parse(raw: bytes | str) -> tuple[str, dict[str, float]] | None:
    try:
        run_id, stages = json.loads(raw)
    except (ValueError, TypeError):
        return None
    if not isinstance(run_id, str) or not isinstance(stages, dict):
        return None
    return run_id, {str(k): float(v) for k, v in stages.items() if isinstance(v, int | float)}


class Lane:
    """Serves the lane on the running event loop: pops an entry only while one of ``slots``
    is free and runs ``execute(run_id, stages)`` as a task of its own. ``stop`` ends the
    popping and waits for the runs in flight."""

    def __init__(
        self, execute: Execute, *, slots: int, url: str, key: str, block_seconds: int = LANE_BLOCK_SECONDS,
        read_margin: float = LANE_READ_MARGIN_SECONDS,
    ) -> None:
        self.execute = execute
        self.slots = asyncio.Semaphore(slots)
        self.url, self.key, self.block_seconds, self.read_margin = url, key, block_seconds, read_margin
        self.running: set[asyncio.Task[Any]] = set()
        self.stopping = False
        self.taken = 0  # entries popped, for logs and tests

    async def serve(self) -> None:
        client = aredis.Redis.from_url(self.url, socket_timeout=self.block_seconds + self.read_margin, socket_keepalive=True)
        try:
            while not self.stopping:
                await self.slots.acquire()
                try:
                    popped = await client.brpop([self.key], timeout=self.block_seconds)
                except (redis.RedisError, OSError) as exc:
                    # Unreachable, silent past the read timeout, or refusing (MISCONF on a
                    # full disk, READONLY after a failover, a wrong key type): the lane keeps
                    # trying on a new connection, never ends quietly. An entry popped as the
                    # read timed out is still a queued run: the recovery sweep sends it again.
                    self.slots.release()
                    log_event("run_lane_unreachable", logging.WARNING, error=type(exc).__name__, detail=str(exc)[:200])
                    await asyncio.sleep(RETRY_SECONDS)
                    continue
                except BaseException:
                    self.slots.release()
                    raise
                if popped is None:
                    self.slots.release()
                    continue
                if self.stopping:  # popped while draining: back to the consumer's end, for another worker
                    self.slots.release()
                    await client.rpush(self.key, popped[1])
                    break
                parsed = _parse(popped[1])
                if parsed is None:
                    self.slots.release()
                    log_event("run_lane_bad_entry", entry=repr(popped[1])[:200])
                    continue
                self.taken += 1
                task = asyncio.ensure_future(self._run(*parsed))
                self.running.add(task)
                task.add_done_callback(self.running.discard)
        finally:
            await client.aclose()

    async def _run(self, run_id: str, stages: dict[str, float]) -> None:
        try:
            outcome = await self.execute(run_id, stages)
        except Exception as exc:  # noqa: BLE001 - one failed run must not stop the lane
            log_event("run_lane_run_failed", run_id=run_id, error=type(exc).__name__, detail=str(exc)[:300])
        else:  # as Celery logged each run task's end
            log_event("run_lane_run_ended", run_id=run_id, outcome=str(outcome))
        finally:
            self.slots.release()

    async def drain(self, timeout: float) -> int:
        """Stop popping (the blocked pop ends within ``block_seconds``) and wait up to
        ``timeout`` seconds for the runs in flight; returns how many were still running."""
        self.stopping = True
        if self.running:
            await asyncio.wait(set(self.running), timeout=timeout)
        return len(self.running)


async def execute_on_worker(run_id: str, stages: dict[str, float]) -> Any:
    """A lane run, as a Celery run task runs it: by the executor registered under the run
    task's name (``brain.executors.RUN``), in a context of its own, so its database calls
    get a thread of their own (``brain.worker.in_own_context``)."""
    execute_run = executors.executor(executors.RUN)
    return await in_own_context(execute_run(run_id, stages=stages))


_lane: Lane | None = None
_serving: Any = None


def start_on_worker() -> None:
    """Serve the lane on this worker process's run loop (``brain.worker.worker_loop``), with
    as many slots as the worker has run slots. Connected to Celery's ``worker_ready``."""
    global _lane, _serving
    if not settings.CELERY_BROKER_URL or (_serving is not None and not _serving.done()):
        return
    _lane = Lane(execute_on_worker, slots=settings.CELERY_WORKER_CONCURRENCY, url=broker_url(), key=lane_key())
    _serving = asyncio.run_coroutine_threadsafe(_lane.serve(), worker_loop())
    log_event("run_lane_serving", lane=_lane.key, slots=settings.CELERY_WORKER_CONCURRENCY)


def stop_on_worker(timeout: float | None = None) -> None:
    """Warm shutdown (Celery's ``worker_shutting_down``): stop taking runs and give the
    runs in flight up to ``RUN_LANE_DRAIN_SECONDS`` to end. A run cut off after that is
    recovered by the sweep once its heartbeat goes stale."""
    lane, serving = _lane, _serving
    if lane is None or serving is None:
        return
    limit = settings.RUN_LANE_DRAIN_SECONDS if timeout is None else timeout
    left = asyncio.run_coroutine_threadsafe(lane.drain(limit), worker_loop()).result(limit + LANE_BLOCK_SECONDS + 5)
    if left:
        log_event("run_lane_cut_off", runs=left)
