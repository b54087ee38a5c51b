"""Health: readiness (``health``, ``GET /api/health/``) and liveness (``health_live``,
``GET /api/health/live/``), both unauthenticated async views.

Both ask this process's database first (``database_answers``: ``SELECT 1`` through the
process's pool, waiting at most ``DATABASE_PROBE_SECONDS``, one probe at a time per
process). Readiness also asks Redis and the checks the layers above registered
(``register_health_check``: llm's ``llm.probe.health_check``), which are not asked
when the database did not answer, since they read it. Liveness asks nothing outside the
process, so an outage of the brain or Redis leaves it 200: it is what the compose
healthchecks ask and what ``services.json`` names for a release switch and the watchdog
(docs/decisions/2026-12-03-health-readiness-and-liveness.md). The public answer is only the
status and stable reason codes; details go to a loopback peer or the owner
(``shows_health_details``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import ipaddress
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect, JsonResponse

from yimi_project.logs import log_event


def is_loopback(address: str | None) -> bool:
    try:
        return ipaddress.ip_address(address or "").is_loopback
    except ValueError:
        return False


def shows_health_details(request: HttpRequest) -> bool:
    """Details (database vendor, channel layer, brain mode, release build) only for a loopback peer
    (``REMOTE_ADDR``: a local monitor, the end-to-end tests) or the logged-in owner."""
    if is_loopback(request.META.get("REMOTE_ADDR")):
        return True
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated and getattr(user, "is_owner", False))


@functools.lru_cache(maxsize=1)
def running_build() -> str | None:
    """The build id of the release directory this code runs from (``<release>/code`` beside
    ``<release>/release.json``, releases.builds), or None outside one. A switch verifies
    each service by it."""
    try:
        return str(json.loads((Path(settings.BASE_DIR).parent / "release.json").read_text())["build_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class HealthCheck:
    """One registered check's answer: ``reason`` (a stable code) when not ``ok``; ``details``
    are told only to the peers ``shows_health_details`` admits."""

    ok: bool
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)


# Checks of the layers above (yimi_project imports none of them): llm registers whether the
# brain role answers (llm.probe). Each is awaited on the event loop, so it must not block it.
_checks: dict[str, Callable[[], Awaitable[HealthCheck]]] = {}


def register_health_check(name: str, check: Callable[[], Awaitable[HealthCheck]]) -> None:
    _checks[name] = check


# How long a health answer waits for this process's database: a pooled connection and
# ``SELECT 1``, instead of the pool's wait (30 s) that any other request would spend. A
# database that does not answer within it is ``database_unavailable``.
DATABASE_PROBE_SECONDS = 3.0

_probe_lock = threading.Lock()
_probe: concurrent.futures.Future[bool] | None = None  # the probe under way, shared by every caller meanwhile
_probe_thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="health-database")


def _select_one(timeout: float) -> bool:
    """``SELECT 1`` on this process's database. PostgreSQL: through the process's pool (what
    every request borrows from), waiting at most ``timeout`` for a connection; without a pool
    (SQLite: the file) on Django's connection of this thread, closed after."""
    try:
        # By nature, not speed: PostgreSQL is reached through a pool, SQLite is a file.
        pool = getattr(connection, "pool", None)  # yimi_project.infra.postgresql: the process's one pool
        if pool is not None:
            pool.open()  # as Django does before its first connection; nothing if open
            with pool.connection(timeout=timeout) as conn:
                conn.execute("SELECT 1")
            return True
        try:
            with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
                cursor.execute("SELECT 1")
        finally:
            connections[DEFAULT_DB_ALIAS].close()
        return True
    except Exception as exc:  # noqa: BLE001 - whatever it is, the database did not answer
        log_event("health_database_unavailable", level=logging.WARNING, error=type(exc).__name__)
        return False


async def database_answers(timeout: float | None = None) -> bool:
    """Whether this process's database answers ``SELECT 1`` within ``timeout`` (default
    ``DATABASE_PROBE_SECONDS``), off the event loop. One probe at a time per process:
    callers arriving while one is under way share its answer, so a probe stuck on a hung
    server costs one thread, not one per health request, and the next caller gets False
    within ``timeout`` while it is stuck."""
    global _probe
    timeout = DATABASE_PROBE_SECONDS if timeout is None else timeout
    with _probe_lock:
        if _probe is None or _probe.done():
            _probe = _probe_thread.submit(_select_one, timeout)
        probe = _probe
    try:
        return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(probe)), timeout + 1.0)
    except TimeoutError:
        return False


def _redis_answers() -> bool:
    import redis

    try:
        with redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2) as client:
            client.ping()
    except redis.RedisError:
        return False
    return True


async def _details(request: HttpRequest, database_ok: bool) -> dict[str, Any] | None:
    """What runs behind the answer, for the peers ``shows_health_details`` admits, or None.
    Without the database only a loopback peer: knowing the owner takes the session."""
    if database_ok:
        show = await sync_to_async(shows_health_details)(request)
    else:
        show = is_loopback(request.META.get("REMOTE_ADDR"))
    if not show:
        return None
    return {
        "database": connection.vendor if database_ok else f"{connection.vendor} (unavailable)",
        "channel_layer": "redis" if settings.REDIS_URL else "in-memory",
        "build": running_build(),
    }


def _answer(reasons: list[str], details: dict[str, Any] | None) -> JsonResponse:
    body: dict[str, Any] = {"status": "degraded" if reasons else "ok"}
    if reasons:
        body["reasons"] = reasons
    if details is not None:
        body.update(details)
    return JsonResponse(body, status=503 if reasons else 200)


async def health(request: HttpRequest) -> JsonResponse:
    """Readiness, unauthenticated: this process's database, Redis when configured, and the
    registered checks (the brain role answers) pass.

    Everyone gets ``{"status": "ok"}`` (200) or ``{"status": "degraded", "reasons": [...]}``
    (503; stable codes such as ``database_unavailable``, ``brain_unreachable``); what runs
    behind it, and what failed how, is told only to the peers ``shows_health_details``
    admits. A database that does not answer within ``DATABASE_PROBE_SECONDS`` is
    ``database_unavailable`` at once, and the registered checks, which read the database,
    are not asked. Whether this process is alive, whatever the services outside it do, is
    ``health_live``'s answer."""
    database_ok = await database_answers()
    reasons = [] if database_ok else ["database_unavailable"]
    details = await _details(request, database_ok)
    if settings.REDIS_URL and not await sync_to_async(_redis_answers, thread_sensitive=False)():
        reasons.append("channel_layer_unreachable")
        if details is not None:
            details["channel_layer"] = "redis (unreachable)"
    if database_ok:
        for check in list(_checks.values()):
            result = await check()
            if details is not None:
                details.update(result.details)
            if not result.ok:
                reasons.append(result.reason)
    return _answer(reasons, details)


async def health_live(request: HttpRequest) -> JsonResponse:
    """Liveness, unauthenticated (``GET /api/health/live/``): 200 ``{"status": "ok"}`` while
    this process serves and its own database answers; ``database_unavailable`` (503) when it
    does not. Nothing outside (the brain, Redis) counts: the release watchdog, a switch's
    verify and the compose healthcheck ask this, so an outage of a service outside the
    release never rolls a good release back. Loopback peers and the owner also learn the
    database, the channel layer and ``build`` (the switch verifies it)."""
    database_ok = await database_answers()
    return _answer([] if database_ok else ["database_unavailable"], await _details(request, database_ok))


def moved_admin_page(request: HttpRequest, rest: str, app: str) -> HttpResponse:
    """A permanent redirect from an admin page whose model moved to another app (its URL
    names the app), keeping the rest of the path and the query string."""
    query = request.META.get("QUERY_STRING", "")
    return HttpResponsePermanentRedirect(f"/admin/{app}/{rest}" + (f"?{query}" if query else ""))
