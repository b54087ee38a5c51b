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
# Packs that keep their state in the platform (schedule, memory) reach its loopback-only
# internal API with the internal token. Standard library only; never through a proxy; never
# to anything but a loopback address. A failed or timed-out connection raises
# ``PlatformLost`` with code DISCONNECTED or TIMEOUT: the platform may or may not have acted.

import http.client  # noqa: E402
import ipaddress  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import urllib.error  # noqa: E402
import urllib.parse  # noqa: E402
import urllib.request  # noqa: E402

PLATFORM_TOKEN_HEADER = "X-Yimi-Internal-Token"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PlatformLost(Exception):
    """The call's outcome is unknown: the connection failed or timed out."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class PlatformNotConfigured(Exception):
    pass


def platform_base_url() -> str:
    base = os.environ.get("YIMI_PLATFORM_URL", "http://127.0.0.1:8000").rstrip("/")
    parts = urllib.parse.urlsplit(base)
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if parts.scheme not in ("http", "https") or not loopback:
        raise PlatformNotConfigured("YIMI_PLATFORM_URL must be an http(s) URL on a loopback address")
    return base


def platform_call(method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """One request to ``/internal/<path>``: (HTTP status, parsed JSON or None)."""
    token = os.environ.get("YIMI_INTERNAL_TOKEN", "")
    if not token:
        raise PlatformNotConfigured("YIMI_INTERNAL_TOKEN is not set")
    data = json.dumps(body).encode("utf-8") if body is not None else None
    request = urllib.request.Request(
        platform_base_url() + "/internal/" + path,
        data=data,
        method=method,
        headers={PLATFORM_TOKEN_HEADER: token, "Accept": "application/json", "Content-Type": "application/json"},
    )
    timeout = float(os.environ.get("YIMI_PLATFORM_TIMEOUT", "10"))
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise PlatformLost("TIMEOUT", f"the platform did not answer within {timeout:g} s") from None
        raise PlatformLost("DISCONNECTED", f"could not reach the platform ({exc.reason})") from None
    except TimeoutError:
        raise PlatformLost("TIMEOUT", f"the platform did not answer within {timeout:g} s") from None
    except (OSError, http.client.HTTPException) as exc:
        raise PlatformLost("DISCONNECTED", f"the connection to the platform broke ({type(exc).__name__})") from None
    try:
        return status, json.loads(raw.decode("utf-8")) if raw else None
    except ValueError:
        return status, None
