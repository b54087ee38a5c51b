"""A streaming client for any OpenAI-compatible Chat Completions endpoint.

``complete`` sends one request with ``stream: true`` and returns the whole answer: its
text (each delta also handed to ``on_text`` as it arrives) and any tool calls, whose
streamed fragments are put back together by index. Every way the call can go wrong ends
in ``BrainError`` with a stable code; callers turn it into an honest notice and never
into a made-up reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import httpx

from llm import usage
from llm.roles import RoleSettings
from llm.usage import CallContext, TokenUsage
from yimi_project.infra import http11


class BrainError(Exception):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass
class ToolCallRequest:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it (may be invalid)

    def message(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Completion:
    text: str = ""
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    # The call's tokens as recorded (llm.usage): reported by the provider, estimated
    # here, or unknown (every count None).
    usage: TokenUsage | None = None

    def assistant_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.tool_calls:
            message["tool_calls"] = [c.message() for c in self.tool_calls]
        return message


def thinking_fields(thinking: bool | None, field_name: str) -> dict[str, Any]:
    """The per-turn thinking switch in the form the endpoint understands: the field named
    by the role's ``thinking_field`` option (none: not sent). ``reasoning_effort`` takes
    ``"high"``/``"low"``; any other field (``enable_thinking``, ...) a boolean."""
    if thinking is None or not field_name:
        return {}
    if field_name == "reasoning_effort":
        return {field_name: "high" if thinking else "low"}
    return {field_name: thinking}


@lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    # Loading the trust store costs ~17 ms; do it once per process, not per request.
    return ssl.create_default_context()


async def complete(
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    on_text: Callable[[str], Awaitable[None]] | None = None,
    thinking: bool | None = None,
    role_settings: RoleSettings,
    usage_for: CallContext | None = None,
) -> Completion:
    """One request to the endpoint of ``role_settings`` (``llm.roles``): its URL, model,
    key, thinking field, timeouts and max tokens. Every call, failed ones included, leaves
    one usage record (``llm.usage``) for the role and ``usage_for`` (run, sub-agent task);
    ``Completion.usage`` holds the counts recorded."""
    headers = {"Content-Type": "application/json"}
    if role_settings.api_key:
        headers["Authorization"] = f"Bearer {role_settings.api_key}"
    body: dict[str, Any] = {"model": role_settings.model, "messages": messages, "stream": True}
    if tools:
        body["tools"] = tools
    if role_settings.max_tokens:
        body["max_tokens"] = role_settings.max_tokens
    body.update(thinking_fields(thinking, role_settings.thinking_field))
    timeout = http11.Timeouts(connect=role_settings.connect_timeout_seconds, read=role_settings.timeout_seconds)
    url = role_settings.base_url.rstrip("/") + "/chat/completions"
    if role_settings.include_usage:
        # The token counts in the stream's last event. Some endpoints reject the field:
        # turn the role's include_usage option off for them (their usage is then unknown).
        body["stream_options"] = {"include_usage": True}
    started = time.monotonic()
    try:
        completion = await _post(url, body, headers, timeout, on_text)
    except (Exception, asyncio.CancelledError) as exc:
        code = exc.code if isinstance(exc, BrainError) else "cancelled" if isinstance(exc, asyncio.CancelledError) else "internal_error"
        await _record_usage(role_settings, usage_for, body, started, usage.UNKNOWN_USAGE, code)
        raise
    tokens = completion.usage
    if tokens is None:
        tokens = usage.UNKNOWN_USAGE
        if role_settings.estimate_usage:
            output = completion.text + "".join(c.name + c.arguments for c in completion.tool_calls)
            tokens = usage.estimate_tokens(messages, output, tools=tools)
    completion.usage = tokens
    await _record_usage(role_settings, usage_for, body, started, tokens, "ok")
    return completion


async def _record_usage(
    role_settings: RoleSettings, context: CallContext | None, body: dict[str, Any], started: float, tokens: TokenUsage, outcome: str
) -> None:
    await usage.record_call_safely(
        context or CallContext(), role=role_settings.role, provider=role_settings.provider, model=str(body.get("model", "")),
        tokens=tokens, duration_ms=int((time.monotonic() - started) * 1000), outcome=outcome,
    )


# Connections are kept per long-lived event loop — a worker process's run loop
# (``brain.tasks``) and, in the embedded default's, the web server's
# (``brain.dispatch.remember_loop``): the connection to the endpoint stays open between calls
# instead of a connect for each call. A connection belongs to the loop it was opened on,
# hence one pool per loop. Any other loop (``async_to_sync``'s, made for one call and then
# dropped) gets a connection for the call, closed after it: a kept connection would keep its
# dead loop, and a socket, alive for good. Calls go over ``yimi_project.infra.http11`` (asyncio streams
# and h11); an endpoint that an environment proxy applies to over httpx, with one kept client
# per loop in the same way.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()
_kept_loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def keep_client_on(loop: asyncio.AbstractEventLoop) -> None:
    """``loop`` lives as long as its process: its model calls share kept connections."""
    _kept_loops.add(loop)
    http11.keep_connections_on(loop)


@contextlib.asynccontextmanager
async def _client() -> AsyncIterator[httpx.AsyncClient]:
    loop = asyncio.get_running_loop()
    if loop not in _kept_loops:
        async with httpx.AsyncClient(verify=_tls_context()) as client:
            yield client
        return
    client = _clients.get(loop)
    if client is None or client.is_closed:
        client = _clients[loop] = httpx.AsyncClient(verify=_tls_context())
    yield client


async def _post(
    url: str, body: dict[str, Any], headers: dict[str, str], timeout: http11.Timeouts, on_text: Callable[[str], Awaitable[None]] | None
) -> Completion:
    pool = http11.pool_of(asyncio.get_running_loop())
    if pool.proxy_applies(url) if pool is not None else http11.proxied(url):
        return await _post_via_proxy(url, body, headers, timeout, on_text)
    content = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    try:
        async with http11.post(url, content, headers, timeout, _tls_context()) as response:
            if response.status != 200:
                raise BrainError("brain_error", f"the brain answered HTTP {response.status}")
            return await _read_stream(response.lines(), on_text)
    except http11.StreamTimeout:
        raise BrainError("brain_timeout", "the brain did not answer in time") from None
    except http11.StreamBroken as exc:
        raise BrainError("brain_unreachable", f"the brain could not be reached ({exc})") from None


async def _post_via_proxy(
    url: str, body: dict[str, Any], headers: dict[str, str], timeout: http11.Timeouts, on_text: Callable[[str], Awaitable[None]] | None
) -> Completion:
    try:
        async with _client() as client, client.stream(
            "POST", url, json=body, headers=headers, timeout=httpx.Timeout(timeout.read, connect=timeout.connect)
        ) as response:
            if response.status_code != 200:
                raise BrainError("brain_error", f"the brain answered HTTP {response.status_code}")
            return await _read_stream(response.aiter_lines(), on_text)
    except httpx.TimeoutException:
        raise BrainError("brain_timeout", "the brain did not answer in time") from None
    except httpx.TransportError as exc:
        raise BrainError("brain_unreachable", f"the brain could not be reached ({type(exc).__name__})") from None


# After ``[DONE]``, how long the body may take to end (providers end it at once): a body
# read to its end leaves the kept connection ready for the next request; one left unread
# closes it, and the next call connects anew (issue 14: that was a TCP connect per run).
BODY_END_SECONDS = 0.25


async def _body_end(lines: AsyncIterator[str]) -> None:
    """Read what follows ``[DONE]`` (nothing, usually) to the body's end, ignoring it."""
    with contextlib.suppress(TimeoutError, httpx.HTTPError, http11.StreamError):
        async with asyncio.timeout(BODY_END_SECONDS):
            async for _ in lines:
                pass


async def _read_stream(lines: AsyncIterator[str], on_text: Callable[[str], Awaitable[None]] | None) -> Completion:
    parts: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    reported: Any = None  # the provider's usage object: in the last event, or on every event
    finished = False
    async for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            finished = True
            await _body_end(lines)
            break
        try:
            event = json.loads(data)
            if event.get("usage"):
                reported = event["usage"]
                if not event.get("choices"):  # stream_options.include_usage: a last event without choices
                    continue
            choice = event["choices"][0]
            delta = choice.get("delta") or {}
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise BrainError("brain_bad_response", "the brain sent a malformed stream event") from None
        content = delta.get("content")
        if content:
            parts.append(content)
            if on_text is not None:
                await on_text(content)
        for fragment in delta.get("tool_calls") or []:
            slot = calls.setdefault(int(fragment.get("index", 0)), {"id": "", "name": "", "arguments": ""})
            function = fragment.get("function") or {}
            slot["id"] = fragment.get("id") or slot["id"]
            slot["name"] += function.get("name") or ""
            slot["arguments"] += function.get("arguments") or ""
        if choice.get("finish_reason"):
            finished = True
    if not finished:
        raise BrainError("brain_bad_response", "the brain's stream ended before the answer was complete")
    tool_calls = [
        ToolCallRequest(slot["id"] or f"call_{index}", slot["name"], slot["arguments"] or "{}")
        for index, slot in sorted(calls.items())
    ]
    return Completion("".join(parts), tool_calls, usage.usage_from_provider(reported))
