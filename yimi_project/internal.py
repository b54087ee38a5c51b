"""Internal HTTP endpoints: loopback only, and only with the instance's internal token.

Used by the capability gateway's three interfaces and by packs calling back into the
platform. A request from any other address, or without the token, is refused with
``forbidden`` and changes nothing.
"""

from __future__ import annotations

import hmac
import ipaddress

from django.conf import settings
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

TOKEN_HEADER = "X-Yimi-Internal-Token"


def is_loopback(address: str | None) -> bool:
    try:
        return ipaddress.ip_address(address or "").is_loopback
    except ValueError:
        return False


class LoopbackWithInternalToken(BasePermission):
    message = "internal endpoints answer loopback requests carrying the internal token only"

    def has_permission(self, request: Request, view: object) -> bool:
        token = request.headers.get(TOKEN_HEADER, "")
        return is_loopback(request.META.get("REMOTE_ADDR")) and hmac.compare_digest(token, settings.INTERNAL_TOKEN)


# --- fast internal JSON endpoints -------------------------------------------------------------
# Django runs each ASGI request's sync code on a fresh thread, which means a fresh database
# connection per request (connections are per thread). The internal endpoints sit on hot
# paths (every tool call), so they are async views whose database work runs on a small
# pool of long-lived threads that keep their connections (CONN_MAX_AGE).

import asyncio  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
from collections.abc import Awaitable, Callable  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from typing import Any, TypeVar  # noqa: E402

from django.db import close_old_connections  # noqa: E402
from django.http import HttpRequest, HttpResponse, JsonResponse  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402

from yimi_project.errors import YimiError  # noqa: E402

T = TypeVar("T")
_DB_THREADS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="internal-db")


def _with_fresh_connection(fn: Callable[[], T]) -> T:
    close_old_connections()  # drops broken or expired connections, keeps healthy ones
    try:
        return fn()
    finally:
        # As at the end of a request: with the PostgreSQL pool (CONN_MAX_AGE 0) this gives
        # the connection back to the pool, so an idle thread holds none.
        close_old_connections()


async def run_db(fn: Callable[[], T]) -> T:
    return await asyncio.get_running_loop().run_in_executor(_DB_THREADS, functools.partial(_with_fresh_connection, fn))


def error_response(exc: YimiError) -> JsonResponse:
    return JsonResponse({"error": exc.payload()}, status=exc.http_status)


def internal_json_view(handler: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]) -> Callable[[HttpRequest], Awaitable[HttpResponse]]:
    """An internal POST endpoint: loopback + token, a JSON object in, a JSON object out."""

    @csrf_exempt
    @functools.wraps(handler)
    async def view(request: HttpRequest) -> HttpResponse:
        token = request.headers.get(TOKEN_HEADER, "")
        if not (is_loopback(request.META.get("REMOTE_ADDR")) and hmac.compare_digest(token, settings.INTERNAL_TOKEN)):
            return error_response(YimiError("forbidden", LoopbackWithInternalToken.message))
        if request.method != "POST":
            return error_response(YimiError("invalid_request", "use POST"))
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            return error_response(YimiError("malformed_json", "the body is not valid JSON"))
        if not isinstance(body, dict):
            return error_response(YimiError("invalid_request", "expected a JSON object"))
        try:
            return JsonResponse(await handler(body))
        except YimiError as exc:
            return error_response(exc)

    return view


def close_thread_connections() -> None:
    """Close the database connections held by the internal pool's threads (shutdown,
    and tests that drop their database). Each of the pool's threads takes one task."""
    import threading

    from django.db import connections

    size = _DB_THREADS._max_workers
    barrier = threading.Barrier(size)

    def close_here() -> None:
        connections.close_all()
        barrier.wait(timeout=10)

    for future in [_DB_THREADS.submit(close_here) for _ in range(size)]:
        future.result(timeout=15)
