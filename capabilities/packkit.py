"""The receipt helper for pack authors (the Python half of the pack template).

A pack's ``server/tools.py`` (and ``fake/tools.py``) declares its tools with ``@tool`` and
returns receipts built with ``receipt(...)``. It depends on nothing but the standard
library, so a pack runs in any host that puts this module on the path.

    from capabilities.packkit import tool, receipt, effect, value

    @tool("Write a file in Yimi's workspace.", {"type": "object", "properties": {...}})
    def write_file(args):
        ...
        return receipt("succeeded", effects=[effect(path, "write", "verified")],
                       values=[value("bytes_written", n, "byte", "filesystem")])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RECEIPT_SCHEMA = 1


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]
    handler: Callable[[dict[str, Any]], dict[str, Any]]


class ToolRegistry:
    def __init__(self) -> None:
        self.tools: dict[str, ToolSpec] = {}

    def __call__(self, description: str, input_schema: dict[str, Any] | None = None) -> Callable:
        def register(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[dict[str, Any]], dict[str, Any]]:
            self.tools[fn.__name__] = ToolSpec(
                fn.__name__, description, input_schema or {"type": "object", "properties": {}}, fn
            )
            return fn

        return register


def receipt(
    status: str,
    *,
    summary: str | None = None,
    effects: list[dict[str, Any]] | None = None,
    values: list[dict[str, Any]] | None = None,
    content: dict[str, Any] | None = None,
    unknowns: list[str] | None = None,
    retry: str | None = None,
    check_with: str | None = None,
    waiting_on: str | None = None,
    error: tuple[str, str] | None = None,
    task_id: str | None = None,
    revision: int | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"receipt_schema": RECEIPT_SCHEMA, "status": status}
    if summary is not None:
        body["summary"] = summary
    if effects:
        body["effects"] = effects
    if values:
        body["values"] = values
    if content is not None:
        body["content"] = content
    if unknowns:
        body["unknowns"] = unknowns
    nxt = {k: v for k, v in (("retry", retry), ("check_with", check_with), ("waiting_on", waiting_on)) if v is not None}
    if nxt:
        body["next"] = nxt
    if error is not None:
        body["error"] = {"code": error[0], "message": error[1]}
    if task_id is not None:
        body["task_id"] = task_id
    if revision is not None:
        body["revision"] = revision
    return body


def effect(target: str, action: str, verification: str) -> dict[str, Any]:
    return {"target": target, "action": action, "verification": verification}


def value(name: str, val: Any, unit: str | None, source: str) -> dict[str, Any]:
    return {"name": name, "value": val, "unit": unit, "source": source}


# --- calling back into the platform --------------------------------------------------------------
# Packs that keep their state in the platform (schedule, memory) declare a ``platform_api``
# and reach the platform's internal listener, a Unix socket bound into their sandbox at
# ``YIMI_PLATFORM_SOCKET``. They hold no platform credential: each call the platform makes
# carries a per-call capability (MCP ``_meta``), which the host hands to that call's
# handler and ``platform_call`` presents. It is good only for what the gateway decided for
# that call. Standard library only. A failed or timed-out connection raises
# ``PlatformLost`` with code DISCONNECTED or TIMEOUT: the platform may or may not have acted.
# Connections are kept alive between calls (``_take_connection``); a failed one is never retried.

import atexit  # noqa: E402
import http.client  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import select  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

CAPABILITY_META_KEY = "ai.yimi/call_capability"
CAPABILITY_HEADER = "X-Yimi-Call-Capability"
_current = threading.local()


class PlatformLost(Exception):
    """The call's outcome is unknown: the connection failed or timed out."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class PlatformNotConfigured(Exception):
    pass


def run_with_capability(handler: Callable[[dict[str, Any]], Any], args: dict[str, Any], capability: str | None) -> Any:
    """Run one tool handler with its call's capability (the host calls this per call, on
    the handler's own thread)."""
    _current.capability = capability
    try:
        return handler(args)
    finally:
        _current.capability = None


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("yimi.internal", timeout=timeout)
        self.socket_path = path
        self.idle_since = 0.0

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def reusable(self, now: float) -> bool:
        """Still open, idle for less than ``_IDLE_SECONDS`` and nothing to read: a socket
        the platform closed while it sat idle reads as end-of-file."""
        if self.sock is None or now - self.idle_since > _IDLE_SECONDS:
            return False
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable


# Keep-alive connections to the platform, shared by the pack process's handler threads: a
# pack that calls back several times in one tool call (or in calls close together) reuses a
# connection instead of opening one per request. A connection is taken out while in use, so
# no two threads share one; one that failed, or whose response asked to close, is dropped.
_IDLE_SECONDS = 20.0
_MAX_IDLE = 4
_idle: dict[str, list[_UnixHTTPConnection]] = {}
_idle_lock = threading.Lock()


def _take_connection(socket_path: str, timeout: float) -> _UnixHTTPConnection:
    now = time.monotonic()
    with _idle_lock:
        pool = _idle.get(socket_path, [])
        while pool:
            connection = pool.pop()
            if connection.reusable(now):
                connection.timeout = timeout
                if connection.sock is not None:
                    connection.sock.settimeout(timeout)
                return connection
            connection.close()
    return _UnixHTTPConnection(socket_path, timeout)


def _give_back(connection: _UnixHTTPConnection) -> None:
    connection.idle_since = time.monotonic()
    with _idle_lock:
        pool = _idle.setdefault(connection.socket_path, [])
        if len(pool) < _MAX_IDLE:
            pool.append(connection)
            return
    connection.close()


def close_platform_connections() -> None:
    """Close the idle keep-alive connections (at process end, or in tests)."""
    with _idle_lock:
        pools = list(_idle.values())
        _idle.clear()
    for pool in pools:
        for connection in pool:
            connection.close()


atexit.register(close_platform_connections)


def platform_call(method: str, path: str, body: dict[str, Any] | None = None, *, timeout: float | None = None) -> tuple[int, Any]:
    """One request to ``/internal/<path>``: (HTTP status, parsed JSON or None). ``timeout``
    (seconds) replaces ``YIMI_PLATFORM_TIMEOUT`` for a call the platform answers slowly on
    purpose (the Mac relay waits for the Mac)."""
    socket_path = os.environ.get("YIMI_PLATFORM_SOCKET", "")
    if not socket_path:
        raise PlatformNotConfigured("YIMI_PLATFORM_SOCKET is not set (the pack declares no platform_api?)")
    capability = getattr(_current, "capability", None)
    if not capability:
        raise PlatformNotConfigured("this call carries no capability from the platform")
    data = json.dumps(body).encode("utf-8") if body is not None else None
    timeout = float(os.environ.get("YIMI_PLATFORM_TIMEOUT", "10")) if timeout is None else timeout
    headers = {CAPABILITY_HEADER: capability, "Accept": "application/json", "Content-Type": "application/json"}
    connection = _take_connection(socket_path, timeout)
    try:
        connection.request(method, "/internal/" + path, body=data, headers=headers)
        response = connection.getresponse()
        status, raw = response.status, response.read()
    except TimeoutError:
        connection.close()
        raise PlatformLost("TIMEOUT", f"the platform did not answer within {timeout:g} s") from None
    except (OSError, http.client.HTTPException) as exc:
        connection.close()
        raise PlatformLost("DISCONNECTED", f"could not reach the platform ({type(exc).__name__})") from None
    except BaseException:
        connection.close()
        raise
    if response.will_close:
        connection.close()
    else:
        _give_back(connection)
    try:
        return status, json.loads(raw.decode("utf-8")) if raw else None
    except ValueError:
        return status, None


# --- egress -----------------------------------------------------------------------------
# A pack reaches only the destinations its manifest's ``network.egress`` declares, through
# its host's egress proxy (``capabilities.egress``; docs/packs.md). HTTP clients that read
# ``HTTPS_PROXY``/``HTTP_PROXY`` (urllib, requests, httpx) need nothing; one that ignores the
# environment passes ``egress_proxy_url()``. Other TCP protocols use ``egress_connection``;
# UDP sends to ``udp_endpoint``. A refused destination raises ``EgressRefused`` (a
# ``ConnectionRefusedError``) whose ``code`` says why: ``egress_not_declared``,
# ``egress_address_refused``, ``egress_unresolved``, ``egress_unreachable``.

from capabilities.mcp_host import egress_shim as _egress  # noqa: E402

EgressRefused = _egress.EgressRefused
egress_connection = _egress.connection
egress_proxy_url = _egress.proxy_url
udp_endpoint = _egress.udp_endpoint


# --- the Mac relay ------------------------------------------------------------------------
# The ``owner-mac`` and ``desktop`` packs do every tool as one operation relayed by the
# platform (``POST /internal/mac/op/``; docs/protocol.md, "The Mac relay"). A refusal by the
# platform or the Mac becomes a ``failed`` receipt (``mac_offline``: retry allowed);
# ``mac_timeout`` and a lost platform connection an ``unknown`` one (the Mac may have acted).

MAC_SOURCE = "owner's Mac"
MAC_RELAY_TIMEOUT_SECONDS = 45.0  # the platform waits up to 5 s for the Mac to take an op and 30 s for its result
MAC_REFUSALS = {
    "paused": "The owner paused Yimi's operations on the Mac; nothing was done.",
    "mac_offline": "The owner's Mac is not connected; nothing was done.",
}


class MacRefusal(Exception):
    def __init__(self, code: str, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


def mac_relay(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The Mac's result for one operation, through the platform; ``MacRefusal`` when refused."""
    status, body = platform_call("POST", "mac/op/", {"kind": kind, "payload": payload}, timeout=MAC_RELAY_TIMEOUT_SECONDS)
    if status == 200 and isinstance(body, dict) and isinstance(body.get("result"), dict):
        return body["result"]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        raise MacRefusal(str(error.get("code", "platform_error")), str(error.get("message", "")), status)
    raise MacRefusal("platform_error", f"the platform answered HTTP {status}", status)


def mac_refusal_summary(code: str, summaries: dict[str, str]) -> str:
    """The receipt's summary for a refusal: the pack's own words (``summaries``), the
    relay's (``MAC_REFUSALS``), or a generic one."""
    return summaries.get(code) or MAC_REFUSALS.get(code) or f"The Mac refused the operation ({code})."


def mac_call(
    kind: str,
    payload: dict[str, Any],
    summaries: dict[str, str],
    *,
    relay: Callable[[str, dict[str, Any]], dict[str, Any]] = mac_relay,
) -> dict[str, Any] | tuple[dict[str, Any]]:
    """The Mac's result for one operation, or (a receipt,) that says why there is none.
    ``relay`` is the request (a pack's fake passes its simulated Mac)."""
    try:
        result = relay(kind, payload)
    except PlatformLost as exc:
        return (receipt("unknown", summary=f"the Mac operation's outcome is unknown: {exc}", error=(exc.code, str(exc))),)
    except PlatformNotConfigured as exc:
        return (receipt("failed", summary=str(exc), retry="forbidden", error=("not_configured", str(exc))),)
    except MacRefusal as exc:
        if exc.code == "mac_timeout":
            return (receipt("unknown", summary="the Mac took the operation but sent no result in time", error=(exc.code, exc.message)),)
        retry = "allowed" if exc.code == "mac_offline" else "forbidden"
        return (receipt("failed", summary=mac_refusal_summary(exc.code, summaries), retry=retry, error=(exc.code, exc.message)),)
    if result.get("status") != "ok":
        code = str(result.get("code", "mac_error"))
        return (receipt("failed", summary=mac_refusal_summary(code, summaries), retry="forbidden", error=(code, str(result.get("message", "")))),)
    return result
