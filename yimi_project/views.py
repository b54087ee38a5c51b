from __future__ import annotations

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse


def health(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse(
        {
            "status": "ok",
            "database": connection.vendor,
            "channel_layer": "redis" if settings.REDIS_URL else "in-memory",
            "brain": "demo" if settings.BRAIN_IS_DEMO else "configured",
        }
    )
