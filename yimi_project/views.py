from __future__ import annotations

import functools
import ipaddress
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse


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


# Checks of the layers above (yimi_project imports none of them): brain registers whether the
# brain role answers (brain.brain_probe). Each is awaited on the event loop, so it must not block it.
_checks: dict[str, Callable[[], Awaitable[HealthCheck]]] = {}


def register_health_check(name: str, check: Callable[[], Awaitable[HealthCheck]]) -> None:
    _checks[name] = check


def _local_checks(request: HttpRequest) -> tuple[list[str], dict[str, Any], bool]:
    """The database and, when configured, Redis (on Django's thread: they use its connections)."""
    details: dict[str, Any] = {
        "database": connection.vendor,
        "channel_layer": "redis" if settings.REDIS_URL else "in-memory",
        "build": running_build(),
    }
    reasons: list[str] = []
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    if settings.REDIS_URL:
        import redis

        try:
            with redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2) as client:
                client.ping()
        except redis.RedisError:
            reasons.append("channel_layer_unreachable")
            details["channel_layer"] = "redis (unreachable)"
    return reasons, details, shows_health_details(request)


async def health(request: HttpRequest) -> JsonResponse:
    """Unauthenticated health check: the database, Redis when configured, and the registered
    checks (the brain role answers) pass.

    Everyone gets ``{"status": "ok"}`` (200) or ``{"status": "degraded", "reasons": [...]}``
    (503; stable codes such as ``brain_unreachable``); what runs behind it, and what failed
    how, is told only to the peers ``shows_health_details`` admits."""
    reasons, details, show = await sync_to_async(_local_checks)(request)
    for check in list(_checks.values()):
        result = await check()
        details.update(result.details)
        if not result.ok:
            reasons.append(result.reason)
    body: dict[str, Any] = {"status": "degraded" if reasons else "ok"}
    if reasons:
        body["reasons"] = reasons
    if show:
        body.update(details)
    return JsonResponse(body, status=503 if reasons else 200)
