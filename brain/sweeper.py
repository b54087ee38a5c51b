"""The embedded default's sweeper: without a broker there is no Celery beat, so the web
server's event loop does beat's periodic jobs itself: it recovers runs left behind
(``brain.recovery.recover_runs``, every ``RUN_RECOVERY_SECONDS``), runs the due sweeps
higher apps register (``register_due_sweep``: schedules' reminders, schedules and watches),
expires unanswered consent cards and unused payment authorizations, settles interrupted
executions (every ``DUE_SWEEP_SECONDS``), and starts a cold-pack round beside them (every
``ARCHIVE_ROUND_SECONDS``). The first websocket connection starts it
(``ensure_embedded_sweeper``); with a broker it never runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from brain.dispatch import keep, remember_loop, uses_broker
from brain.recovery import recover_runs
from consent.services import expire_cards, settle_interrupted_executions
from memory.tasks import archive_round_task
from payments.services import expire_authorizations
from yimi_project.logs import log_event

_sweeper: asyncio.Task | None = None
_due_sweeps: list[Callable[[], Awaitable[None]]] = []


def register_due_sweep(sweep: Callable[[], Awaitable[None]]) -> None:
    """A higher app's due work for the embedded sweeper, what beat sends it with a broker
    (``schedules.tasks.sweep_due``: reminders, schedules, watches; from
    ``SchedulesConfig.ready``). Each round runs them in registration order, before cards
    and authorizations expire."""
    if sweep not in _due_sweeps:
        _due_sweeps.append(sweep)


def ensure_embedded_sweeper() -> None:
    """Embedded default only (no Celery beat): recover runs left by a previous process
    and then every ``RUN_RECOVERY_SECONDS`` (30 s), and every ``DUE_SWEEP_SECONDS`` (10 s)
    run the registered due sweeps and expire unanswered cards and unused authorizations, on the web
    server's event loop; every ``ARCHIVE_ROUND_SECONDS`` (60 s) start a cold-pack round
    beside it (``_archive_round``). Started by the first websocket connection."""
    global _sweeper
    remember_loop()
    if uses_broker() or not settings.YIMI_EMBEDDED_SWEEPER or (_sweeper is not None and not _sweeper.done()):
        return
    _sweeper = asyncio.ensure_future(_sweep_forever())


async def stop_embedded_sweeper() -> None:
    """Cancel the embedded sweeper (if this process runs one) and wait for it to end."""
    global _sweeper
    sweeper, _sweeper = _sweeper, None
    if sweeper is None or sweeper.done():
        return
    sweeper.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sweeper


def _archive_round() -> asyncio.Task:
    """Beat's ``archive-round`` for the embedded default: one cold-pack migration round
    (``memory.tasks.archive_round``), as a task beside the sweep on a database thread of its
    own, since a round uploads for seconds and must hold up neither the due sweeps nor the
    sockets' database calls."""
    def one_round() -> None:
        try:
            archive_round_task()
        finally:
            connections.close_all()  # this pool thread's own connections

    task = asyncio.ensure_future(sync_to_async(one_round, thread_sensitive=False)())
    keep(task)
    return task


async def _sweep_forever() -> None:
    loop = asyncio.get_running_loop()
    last_recovery = loop.time() - settings.RUN_RECOVERY_SECONDS
    last_archive, archive = loop.time() - settings.ARCHIVE_ROUND_SECONDS, None
    while True:
        try:
            if loop.time() - last_recovery >= settings.RUN_RECOVERY_SECONDS:
                last_recovery = loop.time()
                await recover_runs()
            if loop.time() - last_archive >= settings.ARCHIVE_ROUND_SECONDS and (archive is None or archive.done()):
                last_archive, archive = loop.time(), _archive_round()
            for sweep in _due_sweeps:
                await sweep()
            await sync_to_async(expire_cards)()
            await sync_to_async(settle_interrupted_executions)()  # as beat's consent.tasks.expire_cards
            await sync_to_async(expire_authorizations)()
        except Exception as exc:  # noqa: BLE001 - the sweeper must outlive one bad round
            log_event("embedded_sweep_failed", error=type(exc).__name__)
        await asyncio.sleep(settings.DUE_SWEEP_SECONDS)
