from __future__ import annotations

import functools
import ipaddress
import json
from pathlib import Path
from typing import Any

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


def health(request: HttpRequest) -> JsonResponse:
    """Unauthenticated health check: the database and, when configured, Redis answer.

    Everyone gets ``{"status": "ok"}`` (200) or ``{"status": "degraded"}`` (503); what
    runs behind it is told only to the peers ``shows_health_details`` admits."""
    details: dict[str, Any] = {
        "database": connection.vendor,
        "channel_layer": "redis" if settings.REDIS_URL else "in-memory",
        "brain": "demo" if settings.BRAIN_IS_DEMO else "configured",
        "build": running_build(),
    }
    status = "ok"
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    if settings.REDIS_URL:
        import redis

        try:
            with redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2) as client:
                client.ping()
        except redis.RedisError:
            status = "degraded"
            details["channel_layer"] = "redis (unreachable)"
    body: dict[str, Any] = {"status": status}
    if shows_health_details(request):
        body.update(details)
    return JsonResponse(body, status=200 if status == "ok" else 503)
