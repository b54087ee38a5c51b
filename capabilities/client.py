"""The agent side of the gateway: how a sub-agent's tool call reaches ``decide``,
executes over MCP, and comes back as a receipt (F2 from the caller's side).

Two transports for the same three operations: in-process service calls (default) and
the HTTP endpoints on the internal listener (``YIMI_GATEWAY_OVER_HTTP``; a receipt or
observation there needs the call's receipt capability from ``decide``). Either way the caller waits at most
``GATEWAY_DECIDE_TIMEOUT`` (3 s) for ``decide``. Never default to success: if the gateway
cannot be reached, the tool is not executed ("not executed this time"); if the receipt
cannot be recorded after execution, the model is told "result not yet verified".
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from channels.db import database_sync_to_async
from django.conf import settings

from capabilities import services
from capabilities.mcp_host.runtime import on_host_loop
from yimi_project.errors import YimiError
from yimi_project.internal import TOKEN_HEADER

NOT_EXECUTED = "NOT EXECUTED this time: the capability gateway could not be reached, so the tool did not run."
NOT_VERIFIED = (
    "RESULT NOT YET VERIFIED: the tool ran but its result could not be recorded. "
    "Do not tell the owner it worked; check first."
)


class GatewayUnavailable(Exception):
    pass


class GatewayTransport:
    async def decide(self, payload: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def receipt(self, payload: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def observe(self, payload: dict[str, Any]) -> None:
        raise NotImplementedError


class InProcessTransport(GatewayTransport):
    async def decide(self, payload: dict[str, Any]) -> dict[str, Any]:
        return (await _timed(database_sync_to_async(lambda: services.decide(services.CallRequest.from_payload(payload)))())).payload()

    async def receipt(self, payload: dict[str, Any]) -> dict[str, Any]:
        outcome = await _timed(
            database_sync_to_async(services.record_receipt)(
                payload["call_id"], payload.get("result"), transport_error=payload.get("transport_error")
            )
        )
        return outcome.payload()

    async def observe(self, payload: dict[str, Any]) -> None:
        await _timed(
            database_sync_to_async(services.observe)(payload["call_id"], duration_ms=payload["duration_ms"], error=payload.get("error", ""))
        )


# The internal listener speaks plain HTTP on a Unix socket, so TLS is never used; but httpx
# builds a TLS context for every transport it makes, loading the CA bundle each time (tens of
# milliseconds, three times per tool call). One unused context, made once, instead.
_UNUSED_TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


class HttpTransport(GatewayTransport):
    """The gateway's HTTP interface on the platform's internal listener (a Unix socket)."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path

    async def _post(self, op: str, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            async with httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=self.socket_path, verify=_UNUSED_TLS),
                timeout=settings.GATEWAY_DECIDE_TIMEOUT_SECONDS,
                trust_env=False,  # no proxy from the environment: this is a local socket
            ) as client:
                response = await client.post(
                    f"http://{settings.INTERNAL_HOST}/internal/gateway/{op}/", json=payload, headers={TOKEN_HEADER: settings.INTERNAL_TOKEN}
                )
        except httpx.HTTPError as exc:
            raise GatewayUnavailable(f"{op}: {type(exc).__name__}") from None
        if response.status_code >= 500 or response.status_code in (401, 403):
            raise GatewayUnavailable(f"{op}: HTTP {response.status_code}")
        body = response.json()
        if response.status_code != 200:
            error = body.get("error", {})
            raise YimiError(error.get("code", "invalid_request"), error.get("message", ""))
        return body

    async def decide(self, payload: dict[str, Any]) -> dict[str, Any]:
        return await self._post("decide", payload)

    async def receipt(self, payload: dict[str, Any]) -> dict[str, Any]:
        return await self._post("receipt", payload)

    async def observe(self, payload: dict[str, Any]) -> None:
        await self._post("observe", payload)


async def _timed(awaitable: Any) -> Any:
    try:
        return await asyncio.wait_for(awaitable, settings.GATEWAY_DECIDE_TIMEOUT_SECONDS)
    except TimeoutError:
        raise GatewayUnavailable("the gateway did not answer within 3 s") from None


def transport() -> GatewayTransport:
    if settings.YIMI_GATEWAY_OVER_HTTP:
        return HttpTransport(str(settings.YIMI_INTERNAL_SOCKET))
    return InProcessTransport()


@dataclass
class ToolOutcome:
    """What one tool call came to, and the text the model gets back for it."""

    tool: str
    decision: str
    code: str
    model_text: str
    receipt: dict[str, Any] | None = None
    task_id: str | None = None
    call_id: str | None = None
    executed: bool = False
    facts: list[Any] = field(default_factory=list)


async def call_tool(run_id: str, agent_id: str, tool: str, arguments: Any, *, gateway: GatewayTransport | None = None) -> ToolOutcome:
    """decide → execute over MCP → receipt → observe, for one call."""
    gateway = gateway or transport()
    try:
        decided = await gateway.decide({"run_id": run_id, "agent_id": agent_id, "tool": tool, "arguments": arguments})
    except (GatewayUnavailable, YimiError):
        return ToolOutcome(tool, "block", "gateway_unreachable", NOT_EXECUTED)
    if decided["decision"] not in ("allow", "rewrite"):
        text = f"{decided['decision'].upper()} ({decided['code']}): {decided['reason']}. Not executed."
        return ToolOutcome(tool, decided["decision"], decided["code"], text, call_id=decided.get("call_id"))

    started = time.monotonic()
    result = await on_host_loop(
        lambda m: m.call(
            tool, decided["arguments"], timeout=settings.PACK_CALL_TIMEOUT_SECONDS, capability=decided.get("pack_capability")
        )
    )
    duration_ms = int((time.monotonic() - started) * 1000)
    transport_error = result.transport_error or (f"the tool reported an error: {result.text[:200]}" if result.is_error else None)
    proof = decided.get("receipt_capability")
    try:
        stored = await gateway.receipt(
            {"call_id": decided["call_id"], "result": result.structured, "transport_error": transport_error, "capability": proof}
        )
    except (GatewayUnavailable, YimiError):
        return ToolOutcome(tool, decided["decision"], "receipt_unrecorded", NOT_VERIFIED, call_id=decided["call_id"], executed=True)
    try:
        await gateway.observe(
            {"call_id": decided["call_id"], "duration_ms": duration_ms, "error": transport_error or "", "capability": proof}
        )
    except (GatewayUnavailable, YimiError):
        pass  # observing is best effort and never changes a receipt
    receipt = stored["receipt"]
    text = json.dumps({"receipt": receipt}, ensure_ascii=False)
    return ToolOutcome(
        tool, decided["decision"], "ok", text, receipt=receipt, task_id=stored["task_id"], call_id=decided["call_id"], executed=True
    )
