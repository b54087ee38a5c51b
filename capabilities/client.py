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
import atexit
import contextlib
import json
import ssl
import threading
import time
from collections.abc import AsyncIterator
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
# milliseconds). One unused context, made once, instead.
_UNUSED_TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


class LoopClients:
    """One keep-alive ``httpx.AsyncClient`` per (running event loop, socket path).

    A client's connections belong to the loop that opened them, so a client is never shared
    between loops: each loop gets its own, and a client whose loop has closed is discarded,
    never used or closed from another loop (that is what raises "Event loop is closed").
    A loop that ends through ``asyncio.run`` (or a ``Runner``) closes its clients itself: an
    async generator parked on the loop closes them when the loop shuts its async generators
    down. A loop closed without that (``loop.close()`` alone) leaves its clients to be
    dropped by the next lookup; at process end, the clients of loops still open are closed
    on them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_loop: dict[asyncio.AbstractEventLoop, dict[str, httpx.AsyncClient]] = {}
        self._closers: dict[asyncio.AbstractEventLoop, AsyncIterator[None]] = {}

    async def get(self, socket_path: str) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        with self._lock:
            clients = self._by_loop.get(loop)
            fresh_loop = clients is None
            if clients is None:
                self._discard_closed_loops()
                clients = self._by_loop[loop] = {}
            client = clients.get(socket_path)
            if client is None or client.is_closed:
                client = clients[socket_path] = _new_client(socket_path)
        if fresh_loop:
            closer = self._close_at_loop_end(loop, clients)
            self._closers[loop] = closer  # the loop's own set of async generators is weak
            await closer.__anext__()
        return client

    def _discard_closed_loops(self) -> None:
        for dead in [loop for loop in self._by_loop if loop.is_closed()]:
            del self._by_loop[dead]
            self._closers.pop(dead, None)

    async def _close_at_loop_end(self, loop: asyncio.AbstractEventLoop, clients: dict[str, httpx.AsyncClient]) -> AsyncIterator[None]:
        try:
            yield
        finally:
            with self._lock:
                if self._by_loop.get(loop) is clients:
                    del self._by_loop[loop]
                self._closers.pop(loop, None)
            for client in list(clients.values()):
                await client.aclose()

    def close_all(self) -> None:
        """Close the clients of loops still open (at process end)."""
        with self._lock:
            entries = list(self._by_loop.items())
            self._by_loop.clear()
            self._closers.clear()
        for loop, clients in entries:
            if loop.is_closed() or not clients:
                continue
            closing = _close_clients(list(clients.values()))
            try:
                if loop.is_running():
                    asyncio.run_coroutine_threadsafe(closing, loop).result(timeout=1)
                else:
                    loop.run_until_complete(closing)
            except Exception:  # noqa: BLE001 - best effort at exit: the OS closes the sockets anyway
                closing.close()

    def count(self) -> int:
        with self._lock:
            return sum(len(clients) for clients in self._by_loop.values())


async def _close_clients(clients: list[httpx.AsyncClient]) -> None:
    for client in clients:
        await client.aclose()


def _new_client(socket_path: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=socket_path, verify=_UNUSED_TLS),
        trust_env=False,  # no proxy from the environment: this is a local socket
    )


http_clients = LoopClients()
atexit.register(http_clients.close_all)


class HttpTransport(GatewayTransport):
    """The gateway's HTTP interface on the platform's internal listener (a Unix socket),
    over the running loop's keep-alive client (``http_clients``)."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path

    async def _post(self, op: str, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            client = await http_clients.get(self.socket_path)
            response = await client.post(
                f"http://{settings.INTERNAL_HOST}/internal/gateway/{op}/",
                json=payload,
                headers={TOKEN_HEADER: settings.INTERNAL_TOKEN},
                timeout=settings.GATEWAY_DECIDE_TIMEOUT_SECONDS,
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


CANCELLED = "CANCELLED: the call was cancelled before its result came back"


async def _record_cancelled(gateway: GatewayTransport, call_id: str, proof: Any) -> None:
    """A call cancelled while its pack executes it has ended: its result is recorded as lost
    (``unknown``, check first: the pack may have acted), which also ends its pack capability
    at once, so a pack thread still running can no longer act for it. Shielded, so a second
    cancel does not stop the recording; best effort, like any receipt."""
    payload = {"call_id": call_id, "result": None, "transport_error": CANCELLED, "capability": proof}
    with contextlib.suppress(GatewayUnavailable, YimiError):
        await asyncio.shield(gateway.receipt(payload))


async def call_tool(run_id: str, agent_id: str, tool: str, arguments: Any, *, gateway: GatewayTransport | None = None) -> ToolOutcome:
    """decide → execute over MCP → receipt → observe, for one call. A call cancelled during
    its execution records its result as lost before the cancel goes on (``_record_cancelled``).
    The tool's pack host is asked first whether it can run the call: if not, ``decide``
    refuses it (``pack_unavailable``) instead of recording it as executing."""
    gateway = gateway or transport()
    request = {"run_id": run_id, "agent_id": agent_id, "tool": tool, "arguments": arguments}
    unavailable = await on_host_loop(lambda m: m.unavailable(tool))  # its host starts now if it was not running
    if unavailable:
        request["pack_unavailable"] = unavailable  # refused by the gateway, never recorded as executing
    try:
        decided = await gateway.decide(request)
    except (GatewayUnavailable, YimiError):
        return ToolOutcome(tool, "block", "gateway_unreachable", NOT_EXECUTED)
    if decided["decision"] not in ("allow", "rewrite"):
        text = f"{decided['decision'].upper()} ({decided['code']}): {decided['reason']}. Not executed."
        return ToolOutcome(tool, decided["decision"], decided["code"], text, call_id=decided.get("call_id"))

    started = time.monotonic()
    proof = decided.get("receipt_capability")
    try:
        result = await on_host_loop(
            lambda m: m.call(
                tool, decided["arguments"], timeout=settings.PACK_CALL_TIMEOUT_SECONDS, capability=decided.get("pack_capability")
            )
        )
    except asyncio.CancelledError:
        await _record_cancelled(gateway, decided["call_id"], proof)
        raise
    duration_ms = int((time.monotonic() - started) * 1000)
    transport_error = result.transport_error or (f"the tool reported an error: {result.text[:200]}" if result.is_error else None)
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
