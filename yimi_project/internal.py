"""Internal HTTP endpoints: served on the internal listener only.

The internal listener is daphne's Unix socket (``YIMI_INTERNAL_SOCKET``, under the data
directory), which no reverse proxy forwards and no network reaches; the public TCP
listener refuses every ``/internal/`` path with ``forbidden``, whatever the client's
address. Two parties use it, each with its own credential:

- the **platform's own processes** (a Celery worker reaching the capability gateway)
  present the instance's internal token (``X-Yimi-Internal-Token``);
- **capability packs** calling back into the platform (memory, reminders) present the
  per-call capability of the call they are executing (``X-Yimi-Call-Capability``, see
  ``yimi_project.call_capability``), good only while that call executes and only at the
  API made for their pack (``API_PACKS``); they never hold the internal token.

A request without the right credential is refused with ``forbidden`` and changes nothing.
"""

from __future__ import annotations

import hmac
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from yimi_project import call_capability, jsonbody
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


# The packs each platform API answers. Declaring an API in a manifest is not enough: an
# API that holds the owner's data answers only calls of the shipped pack it was made for,
# so a pack that lists ``memory`` or ``health`` among its ``platform_api``, or a registry
# version under a shipped pack's name (its capability says ``published``), gets nothing
# from it. ``executor`` (a model turn, no owner data) answers any pack that declared it.
API_PACKS: dict[str, frozenset[str]] = {
    "memory": frozenset({"memory"}),
    "reminders": frozenset({"schedule"}),
    "model_settings": frozenset({"model_settings"}),
    "erasure": frozenset({"erasure"}),
    "profile": frozenset({"personal"}),
    "location": frozenset({"location"}),
    "health": frozenset({"health"}),
    "watches": frozenset({"delivery"}),
    "mac": frozenset({"owner-mac", "desktop"}),
    "workshop": frozenset({"workshop"}),
    "releases": frozenset({"release"}),
}


def signed_pack_call_claims(request: HttpRequest | Request, api: str) -> dict[str, Any] | None:
    """The claims of the pack capability on this request if it arrived on the internal
    listener, is validly signed and unexpired, its pack declared ``api`` and ``api``
    answers that pack (``API_PACKS``: the shipped pack it was made for); None otherwise.
    Not yet whether its call is still executing: ``pack_call_claims`` asks that too."""
    if not on_internal_listener(request):
        return None
    claims = call_capability.verify(call_capability.PACK, request.headers.get(call_capability.HEADER, ""))
    if claims is None or api not in claims.get("apis", ()):
        return None
    packs = API_PACKS.get(api)
    if packs is not None and (claims.get("pack") not in packs or claims.get("published") is True):
        return None
    return claims


def pack_call_claims(request: HttpRequest | Request, api: str) -> dict[str, Any] | None:
    """``signed_pack_call_claims``, and only while the call is still executing
    (``call_capability.live``: a call whose end the gateway recorded has a dead
    capability). Reads the database: from async code use ``live_pack_call_claims``."""
    claims = signed_pack_call_claims(request, api)
    if claims is None or not call_capability.live(claims, api):
        return None
    return claims


async def live_pack_call_claims(request: HttpRequest | Request, api: str) -> dict[str, Any] | None:
    """``pack_call_claims`` for an async view (the liveness query runs on a database thread)."""
    claims = signed_pack_call_claims(request, api)
    if claims is None or not await run_db(lambda: call_capability.live(claims, api)):
        return None
    return claims


class PlatformParty(BasePermission):
    message = "internal endpoints answer on the internal listener, to the platform's own processes only"

    def has_permission(self, request: Request, view: object) -> bool:
        return is_platform_party(request)


class PackCall(BasePermission):
    """A pack executing a call whose capability grants the view's ``platform_api``
    (``pack_call_claims``: the API's own pack, its call still executing). The claims are
    left on ``request.pack_call`` for the view's own checks (category, target)."""

    message = "this endpoint answers only the pack it serves, and only while that pack executes a call"

    def has_permission(self, request: Request, view: object) -> bool:
        claims = pack_call_claims(request, getattr(view, "platform_api", ""))
        if claims is None:
            return False
        request.pack_call = claims  # type: ignore[attr-defined]
        return True


def require_call(request: Request, categories: tuple[str, ...], *, tools: tuple[str, ...] = (), **target: Any) -> None:
    """Refuse unless the executing call was decided as one of ``categories``, is one of
    ``tools`` (full names) when given — a write is tied to the tool whose target was
    decided — and, where it named a target argument, this operation is on that same target."""
    claims = request.pack_call  # type: ignore[union-attr]
    if tools and claims.get("tool") not in tools:
        raise YimiError("forbidden", f"this call is {claims.get('tool')!r}; this operation belongs to {' or '.join(tools)}")
    if claims.get("category") not in categories:
        raise YimiError(
            "forbidden", f"this call was decided as {claims.get('category')!r}; this operation needs {' or '.join(categories)}"
        )
    named = claims.get("target") or {}
    for name, value in target.items():
        if name in named and str(named[name]) != str(value):
            raise YimiError("forbidden", f"this call is about {name} {named[name]}, not {value}")


def call_owner(claims: dict[str, Any]) -> int:
    """The owner (user id) of the executing call whose capability claims are ``claims``;
    ``no_owner`` when the call has none on this instance."""
    owner = claims.get("owner")
    if not isinstance(owner, int):
        raise YimiError("no_owner", "this call has no owner on this instance (run manage.py yimi_init)")
    return owner


def pack_owner(request: Request) -> int:
    """The owner of the call a ``PackCall`` request is executing (``call_owner``)."""
    return call_owner(request.pack_call)  # type: ignore[attr-defined]


def json_object(request: Request) -> dict[str, Any]:
    """The request's body, refused (``invalid_request``) unless it is a JSON object."""
    if not isinstance(request.data, dict):
        raise YimiError("invalid_request", "expected a JSON object")
    return request.data


# --- fast internal JSON endpoints -------------------------------------------------------------
# Django runs each ASGI request's sync code on a fresh thread, which means a fresh database
# connection per request (connections are per thread). The internal endpoints sit on hot
# paths (every tool call), so they are async views whose database work runs on a small
# pool of long-lived threads that keep their connections (CONN_MAX_AGE).

import asyncio  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
from collections.abc import Awaitable, Callable  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from typing import TypeVar  # noqa: E402

from django.core.serializers.json import DjangoJSONEncoder  # noqa: E402
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


JsonHandler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


async def _answer(handler: JsonHandler, *, platform_party: bool, method: str, body: Callable[[], bytes]) -> tuple[int, dict[str, Any]]:
    """One internal JSON call, whichever way it arrived: (HTTP status, JSON object)."""
    try:
        if not platform_party:
            raise YimiError("forbidden", PlatformParty.message)
        if method != "POST":
            raise YimiError("invalid_request", "use POST")
        return 200, await handler(jsonbody.parse_object(body()))
    except YimiError as exc:
        return exc.http_status, {"error": exc.payload()}


def internal_json_view(handler: JsonHandler) -> Callable[[HttpRequest], Awaitable[HttpResponse]]:
    """An internal POST endpoint for the platform's own processes (internal listener +
    internal token): a JSON object in, a JSON object out. On daphne's internal socket
    ``InternalJsonEndpoints`` answers it before Django's request machinery; the view is
    what every other server (the tests' WSGI socket server, Django's test client) runs."""

    @csrf_exempt
    @functools.wraps(handler)
    async def view(request: HttpRequest) -> HttpResponse:
        status, payload = await _answer(
            handler, platform_party=is_platform_party(request), method=request.method or "",
            body=lambda: jsonbody.request_body(request),
        )
        return JsonResponse(payload, status=status)

    view.internal_json_handler = handler  # type: ignore[attr-defined]
    return view


class InternalJsonEndpoints:
    """ASGI, in front of Django: the ``internal_json_view`` endpoints (the gateway's
    decide, receipt and observe) answered on the internal listener without Django's
    request machinery.

    Why: every tool call crosses them twice, and Django's path costs several times the
    call's own work — about a dozen thread hops for the sync middleware methods and the
    request signals, sessions, auth, CSRF, messages, security headers, static files and
    the login lockout. None of that applies here: the internal listener is a Unix socket
    nobody else reaches (no browser, no cookies, no proxy, no user), and the caller
    proves itself with the internal token. What is kept is exactly the view's contract
    (``_answer``: the token, POST, a JSON object in and out through the one JSON guard,
    ``yimi_project.jsonbody``, ``YimiError`` → its status and payload), plus Django's body
    size limit (``DATA_UPLOAD_MAX_MEMORY_SIZE``: ``payload_too_large``). An unexpected exception is logged (``django.request``, as
    Django does) and answered 500 ``internal_error``. Requests on the public listener,
    and any other path, go to Django unchanged.
    """

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]], send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] == "http" and scope.get("client") is None and scope.get("server") is None:
            path = scope["path"]
            root = scope.get("root_path") or ""
            handler = _json_handler(path[len(root):] if root and path.startswith(root) else path)
            if handler is not None:
                await self._serve(handler, scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _serve(self, handler: JsonHandler, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]], send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        token = b""
        for name, value in scope.get("headers") or ():
            if name == _TOKEN_HEADER_BYTES:
                token = value
                break
        platform_party = hmac.compare_digest(token, settings.INTERNAL_TOKEN.encode())
        method = scope.get("method", "")
        raw = b""
        if platform_party and method == "POST":
            limit = jsonbody.body_limit()
            chunks: list[bytes] = []
            size = 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if limit is not None and size > limit:
                    exc = jsonbody.too_large()
                    await _respond(send, exc.http_status, {"error": exc.payload()})
                    return
                chunks.append(chunk)
                if not message.get("more_body"):
                    break
            raw = b"".join(chunks)
        try:
            status, payload = await _answer(handler, platform_party=platform_party, method=method, body=lambda: raw)
        except Exception:
            logging.getLogger("django.request").exception("internal endpoint failed: %s", scope["path"])
            status, payload = 500, {"error": {"code": "internal_error", "message": "the server failed on this call"}}
        await _respond(send, status, payload)


_TOKEN_HEADER_BYTES = TOKEN_HEADER.lower().encode()


@functools.lru_cache(maxsize=64)
def _json_handler(path: str) -> JsonHandler | None:
    """The ``internal_json_view`` handler serving ``path``, or None (anything else)."""
    from django.urls import Resolver404, resolve

    try:
        match = resolve(path)
    except Resolver404:
        return None
    return getattr(match.func, "internal_json_handler", None)


async def _respond(send: Callable[[dict[str, Any]], Awaitable[None]], status: int, payload: dict[str, Any]) -> None:
    data = json.dumps(payload, cls=DjangoJSONEncoder).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


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
