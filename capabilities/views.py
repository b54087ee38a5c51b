"""The gateway's three interfaces over HTTP on the internal listener.

All three need the internal token (the platform's own processes); ``receipt`` and
``observe`` also need the receipt capability ``decide`` issued for that call, so nobody
reports on a call they are not executing.
"""

from __future__ import annotations

from typing import Any

from capabilities import services
from yimi_project import call_capability
from yimi_project.errors import YimiError
from yimi_project.internal import internal_json_view, run_db


def _executing(body: dict[str, Any]) -> None:
    if not call_capability.receipt_allows(body.get("capability"), body.get("call_id")):
        raise YimiError("forbidden", "a receipt or observation needs the receipt capability decide issued for this call")


@internal_json_view
async def decide(body: dict[str, Any]) -> dict[str, Any]:
    request = services.CallRequest.from_payload(body)
    return (await run_db(lambda: services.decide(request))).payload()


@internal_json_view
async def receipt(body: dict[str, Any]) -> dict[str, Any]:
    _executing(body)
    error = body.get("transport_error")
    outcome = await run_db(
        lambda: services.record_receipt(body.get("call_id"), body.get("result"), transport_error=str(error) if error else None)
    )
    return outcome.payload()


@internal_json_view
async def observe(body: dict[str, Any]) -> dict[str, Any]:
    _executing(body)
    await run_db(lambda: services.observe(body.get("call_id"), duration_ms=body.get("duration_ms"), error=body.get("error", "")))
    return {"ok": True}
