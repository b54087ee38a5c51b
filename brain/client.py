"""A streaming client for any OpenAI-compatible Chat Completions endpoint.

``stream_chat`` yields the text deltas of one completion as they arrive (SSE,
``stream: true``). Every way the call can go wrong ends in ``BrainError`` with a stable
code; the caller turns it into an honest notice and never into a made-up reply.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from functools import lru_cache
from typing import Any

import httpx
from django.conf import settings


class BrainError(Exception):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    # Loading the trust store costs ~17 ms; do it once per process, not per request.
    return ssl.create_default_context()


async def stream_chat(messages: list[dict[str, Any]]) -> AsyncIterator[str]:
    headers = {"Content-Type": "application/json"}
    if settings.BRAIN_API_KEY:
        headers["Authorization"] = f"Bearer {settings.BRAIN_API_KEY}"
    body = {"model": settings.BRAIN_MODEL, "messages": messages, "stream": True}
    timeout = httpx.Timeout(settings.BRAIN_TIMEOUT_SECONDS, connect=settings.BRAIN_CONNECT_TIMEOUT_SECONDS)
    url = settings.BRAIN_BASE_URL.rstrip("/") + "/chat/completions"
    try:
        async with httpx.AsyncClient(timeout=timeout, verify=_tls_context()) as client:
            async with client.stream("POST", url, json=body, headers=headers) as response:
                if response.status_code != 200:
                    raise BrainError("brain_error", f"the brain answered HTTP {response.status_code}")
                async for delta in _deltas(response):
                    yield delta
    except httpx.TimeoutException:
        raise BrainError("brain_timeout", "the brain did not answer in time") from None
    except httpx.TransportError as exc:
        raise BrainError("brain_unreachable", f"the brain could not be reached ({type(exc).__name__})") from None


async def _deltas(response: httpx.Response) -> AsyncIterator[str]:
    finished = False
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            finished = True
            break
        try:
            event = json.loads(data)
            choice = event["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            raise BrainError("brain_bad_response", "the brain sent a malformed stream event") from None
        content = (choice.get("delta") or {}).get("content")
        if content:
            yield content
        if choice.get("finish_reason"):
            finished = True
    if not finished:
        raise BrainError("brain_bad_response", "the brain's stream ended before the answer was complete")
