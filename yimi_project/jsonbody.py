"""The one JSON guard: what any JSON a client sends must be before a view or handler sees it.

Every HTTP endpoint reads its JSON body through here — DRF views through ``JSONBodyParser``
(the only parser, ``REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"]``), the internal JSON views
(``yimi_project.internal``) and the Mac relay endpoint through ``parse`` — and the device
and voice websockets check each frame with ``loads`` and ``check`` (``devices.consumers.
connection.parse_frame``). So the limits are one set:

- JSON text (RFC 8259), UTF-8, with no ``NaN``/``Infinity`` and no number too large for a
  float (``1e400``): PostgreSQL's ``jsonb`` cannot store them;
- no string — a key, a value, a field nobody reads — holding NUL (``\\u0000``; PostgreSQL
  text cannot store it) or a lone surrogate (``\\ud800``-``\\udfff`` not part of a pair:
  not a character, UTF-8 cannot encode it). JSON escapes make both; a raw NUL or a raw
  surrogate is not valid JSON or UTF-8 to begin with. A surrogate pair is one character;
- objects and arrays nested at most ``MAX_DEPTH`` levels (the protocol's frames need 3);
- over HTTP, a body of at most ``DATA_UPLOAD_MAX_MEMORY_SIZE`` bytes (Django's, 2.5 MiB);
- over HTTP, no NUL in the path or the query string either (``%00``; ``TextGuardMiddleware``,
  for every view: a query parameter reaches the database as text too).

Over HTTP a refusal is a 4xx ``YimiError`` raised before anything is read or changed:
``malformed_json`` (not JSON, not UTF-8, ``NaN``), ``invalid_request`` with ``details.reason``
``nul``, ``lone_surrogate``, ``too_deep`` or ``number_out_of_range``, and
``payload_too_large`` (413). The websockets answer the same refusals with their own codes
(``malformed_json``, ``invalid_frame``; docs/protocol.md). Checking is iterative, so no
body can exhaust the stack.
"""

from __future__ import annotations

import json
import math
import re
from typing import IO, Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from rest_framework.parsers import BaseParser

from yimi_project.errors import YimiError
from yimi_project.middleware import BeforeViewMiddleware

# How deep objects and arrays may nest, on the websockets and over HTTP.
MAX_DEPTH = 32
# What no string may hold: NUL and any surrogate code point. A surrogate pair escaped in
# JSON (\ud83d\ude00) decodes to one character outside this range, so it passes.
UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")

# The reasons a parsed value is refused (``details.reason`` over HTTP).
NUL = "nul"
LONE_SURROGATE = "lone_surrogate"
TOO_DEEP = "too_deep"
NUMBER_OUT_OF_RANGE = "number_out_of_range"


class Malformed(ValueError):
    """Not JSON text: a syntax error, ``NaN``/``Infinity``, or (bytes) not UTF-8."""


class Refused(ValueError):
    """JSON, but not storable or too deep; ``reason`` is one of the reasons above."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _no_constant(name: str) -> Any:
    raise Malformed(f"{name} is not JSON")


def loads(data: str | bytes) -> Any:
    """``json.loads`` without ``NaN``/``Infinity``: ``Malformed`` for anything not JSON,
    ``Refused(too_deep)`` when the parser itself gives up on the nesting."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise Refused(TOO_DEEP, f"JSON nests at most {MAX_DEPTH} levels deep") from None
    except Malformed:
        raise
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, too many digits
        raise Malformed(str(exc)) from None


def unclean(value: str) -> str | None:
    """Why the string ``value`` cannot be kept (``nul``, ``lone_surrogate``), or None."""
    found = UNSTORABLE.search(value)
    if found is None:
        return None
    return NUL if found.group() == "\x00" else LONE_SURROGATE


def check(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """Raise ``Refused`` unless every string in ``value`` (keys too) is clean, every float
    is finite and nothing nests deeper than ``max_depth``. Iterative."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, str):
            reason = unclean(item)
            if reason == NUL:
                raise Refused(NUL, "strings cannot contain NUL (\\u0000)")
            if reason == LONE_SURROGATE:
                raise Refused(LONE_SURROGATE, "strings cannot contain a lone surrogate (\\ud800-\\udfff)")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise Refused(NUMBER_OUT_OF_RANGE, "a number is too large")
        elif isinstance(item, dict | list):
            if depth > max_depth:
                raise Refused(TOO_DEEP, f"JSON nests at most {max_depth} levels deep")
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)


def body_limit() -> int | None:
    """The most bytes an HTTP JSON body may have (Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE``)."""
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def too_large() -> YimiError:
    limit = body_limit()
    return YimiError("payload_too_large", f"a JSON body is limited to {limit} bytes", limit=limit)


def parse(body: bytes) -> Any:
    """An HTTP request's JSON body, checked (the module's rules). An empty body is ``{}``.
    Raises ``YimiError``: ``payload_too_large``, ``malformed_json``, ``invalid_request``."""
    limit = body_limit()
    if limit is not None and len(body) > limit:
        raise too_large()
    if not body:
        return {}
    try:
        value = loads(body)
        check(value)
    except Malformed as exc:
        raise YimiError("malformed_json", f"the body is not valid JSON: {exc}"[:200]) from None
    except Refused as exc:
        raise YimiError("invalid_request", exc.message, reason=exc.reason) from None
    return value


def parse_object(body: bytes) -> dict[str, Any]:
    """``parse``, and refused (``invalid_request``) unless the body is a JSON object."""
    value = parse(body)
    if not isinstance(value, dict):
        raise YimiError("invalid_request", "expected a JSON object")
    return value


def request_body(request: HttpRequest) -> bytes:
    """A Django request's body, ``payload_too_large`` beyond Django's limit (Django itself
    would answer its ``RequestDataTooBig`` with a bare 400 page)."""
    try:
        return request.body
    except RequestDataTooBig:
        raise too_large() from None


class JSONBodyParser(BaseParser):
    """DRF's parser for ``application/json``, through ``parse``. It reads at most one byte
    more than the limit, whatever ``Content-Length`` said."""

    media_type = "application/json"

    def parse(self, stream: IO[bytes] | None, media_type: str | None = None, parser_context: Any = None) -> Any:
        if stream is None:
            return {}
        limit = body_limit()
        return parse(stream.read() if limit is None else stream.read(limit + 1))


def url_refusal(request: HttpRequest) -> YimiError | None:
    """``invalid_request`` (``reason`` ``nul`` or ``lone_surrogate``) when the request's
    decoded path, or a query parameter's name or value, holds what no string may; else None.
    (Django decodes percent-escapes as UTF-8 with replacement, so only ``%00`` gets through.)"""
    texts = [request.path, *(text for key, values in request.GET.lists() for text in (key, *values))]
    for text in texts:
        reason = unclean(text)
        if reason is not None:
            what = "NUL (%00)" if reason == NUL else "a lone surrogate"
            return YimiError("invalid_request", f"the path and query cannot contain {what}", reason=reason)
    return None


class TextGuardMiddleware(BeforeViewMiddleware):
    """Refuses a path or query string with NUL (``url_refusal``) before any view runs:
    the JSON guard's rule for the rest of a request. Sync and async."""

    def before(self, request: HttpRequest) -> HttpResponseBase | None:
        refusal = url_refusal(request)
        return None if refusal is None else _refused(refusal)


def _refused(refusal: YimiError) -> JsonResponse:
    return JsonResponse({"error": refusal.payload()}, status=refusal.http_status)
