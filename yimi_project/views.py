from __future__ import annotations

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse


def health(request: HttpRequest) -> JsonResponse:
    """Unauthenticated health check: the database and, when configured, Redis answer."""
    body = {
        "status": "ok",
        "database": connection.vendor,
        "channel_layer": "redis" if settings.REDIS_URL else "in-memory",
        "brain": "demo" if settings.BRAIN_IS_DEMO else "configured",
    }
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    if settings.REDIS_URL:
        import redis

        try:
            redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2).ping()
        except redis.RedisError:
            body.update(status="degraded", channel_layer="redis (unreachable)")
            return JsonResponse(body, status=503)
    return JsonResponse(body)
