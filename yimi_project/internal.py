"""Internal HTTP endpoints: served on the internal listener only.

The internal listener is daphne's Unix socket (``YIMI_INTERNAL_SOCKET``, under the data
directory), which no reverse proxy forwards and no network reaches; the public TCP
listener refuses every ``/internal/`` path with ``forbidden``, whatever the client's
address. Two parties use it, each with its own credential:

- the **platform's own processes** (a Celery worker reaching the capability gateway)
  present the instance's internal token (``X-Yimi-Internal-Token``);
- **capability packs** calling back into the platform (memory, reminders) present the
  per-call capability of the call they are executing (``X-Yimi-Call-Capability``, see
  ``yimi_project.call_capability``); they never hold the internal token.

A request without the right credential is refused with ``forbidden`` and changes nothing.
"""

from __future__ import annotations

import hmac
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from yimi_project import call_capability
from yimi_project.errors import YimiError

TOKEN_HEADER = "X-Yimi-Internal-Token"
# Set by the tests' Unix-socket WSGI server; daphne's Unix-socket requests are recognised
# by their scope (no client and no server address). Not reachable from any header.
INTERNAL_LISTENER_META = "yimi.internal_listener"


def on_internal_listener(request: HttpRequest | Request) -> bool:
    """True when the request arrived on the internal listener (a Unix socket)."""
    if request.META.get(INTERNAL_LISTENER_META) is True:
        return True
    scope = getattr(request, "scope", None)
    return (
        isinstance(scope, dict) and scope.get("type") == "http" and scope.get("client") is None and scope.get("server") is None
    )


def is_platform_party(request: HttpRequest | Request) -> bool:
    """The platform's own process: the internal listener and the internal token."""
    token = request.headers.get(TOKEN_HEADER, "")
    return on_internal_listener(request) and hmac.compare_digest(token, settings.INTERNAL_TOKEN)


def pack_call_claims(request: HttpRequest | Request, api: str) -> dict[str, Any] | None:
    """The claims of the pack capability on this request, if it is valid, unexpired and
    its pack declared ``api`` (``memory``, ``reminders``); None otherwise."""
    if not on_internal_listener(request):
        return None
    claims = call_capability.verify(call_capability.PACK, request.headers.get(call_capability.HEADER, ""))
    if claims is None or api not in claims.get("apis", ()):
        return None
    return claims


class PlatformParty(BasePermission):
    message = "internal endpoints answer on the internal listener, to the platform's own processes only"

    def has_permission(self, request: Request, view: object) -> bool:
        return is_platform_party(request)


class PackCall(BasePermission):
    """A pack executing a call whose capability grants the view's ``platform_api``.
    The claims are left on ``request.pack_call`` for the view's own checks (category,
    target)."""

    message = "this endpoint answers a pack only while it executes a call that declared this platform API"

    def has_permission(self, request: Request, view: object) -> bool:
        claims = pack_call_claims(request, getattr(view, "platform_api", ""))
        if claims is None:
            return False
        request.pack_call = claims  # type: ignore[attr-defined]
        return True


def require_call(request: Request, categories: tuple[str, ...], **target: Any) -> None:
    """Refuse unless the executing call was decided as one of ``categories`` and, where it
    named a target argument, this operation is on that same target."""
    claims = request.pack_call  # type: ignore[union-attr]
    if claims.get("category") not in categories:
        raise YimiError(
            "forbidden", f"this call was decided as {claims.get('category')!r}; this operation needs {' or '.join(categories)}"
        )
    named = claims.get("target") or {}
    for name, value in target.items():
        if name in named and str(named[name]) != str(value):
            raise YimiError("forbidden", f"this call is about {name} {named[name]}, not {value}")


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
from typing import TypeVar  # noqa: E402

from django.db import close_old_connections  # noqa: E402
from django.http import HttpResponse, JsonResponse  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402

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
    """An internal POST endpoint for the platform's own processes (internal listener +
    internal token): a JSON object in, a JSON object out."""

    @csrf_exempt
    @functools.wraps(handler)
    async def view(request: HttpRequest) -> HttpResponse:
        if not is_platform_party(request):
            return error_response(YimiError("forbidden", PlatformParty.message))
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
