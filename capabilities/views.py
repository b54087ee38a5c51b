"""The gateway's three interfaces over loopback HTTP (internal token required)."""

from __future__ import annotations

from typing import Any

from capabilities import services
from yimi_project.internal import internal_json_view, run_db


@internal_json_view
async def decide(body: dict[str, Any]) -> dict[str, Any]:
    request = services.CallRequest.from_payload(body)
    return (await run_db(lambda: services.decide(request))).payload()


@internal_json_view
async def receipt(body: dict[str, Any]) -> dict[str, Any]:
    error = body.get("transport_error")
    outcome = await run_db(
        lambda: services.record_receipt(body.get("call_id"), body.get("result"), transport_error=str(error) if error else None)
    )
    return outcome.payload()


@internal_json_view
async def observe(body: dict[str, Any]) -> dict[str, Any]:
    await run_db(lambda: services.observe(body.get("call_id"), duration_ms=body.get("duration_ms"), error=body.get("error", "")))
    return {"ok": True}
