"""Receipts at the trust boundary: schema validation and the six invariants.

``normalize`` turns whatever a pack returned into a valid receipt. It only ever
downgrades (never turns an unknown into a success):

1. ``succeeded`` with effects that are not verified → ``partial`` if some are verified,
   ``unknown`` if none are (or if an effectful call reported no effect at all), plus a
   contradiction note;
2. an error code mentioning TIMEOUT or DISCONNECTED → ``unknown``, retry only after a check;
3. a number without a unit is a contract violation: the value is not stated as a fact;
4. a pack may not write ``rejected`` (only the gateway blocks) → ``unknown``;
5. anything that is not a valid receipt → ``unknown``;
6. a ``send`` effect claimed ``verified`` → ``service_ack``, with the violation
   ``send_verified_without_readback``: a send is only ever acknowledged by a server, so no
   pack certifies delivery through its own send. That the message arrived (or was read) is
   its own effect, action ``deliver`` (or ``seen``), verified by reading it back at the
   recipient's end (``capabilities.truth``'s ``PROOF_CLAIMS``).

A lost result whose transport error names a pack limit (``pack_limit_memory: ...``; the
pack host was stopped for reaching it, ``mcp_host/limits.py``) is ``unknown`` with that
code as its ``error``; one that says the pack's host could not run it at all
(``pack_unavailable: ...``) is ``failed``: nothing ran, so nothing needs a check.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from capabilities.manifest import ToolDecl, contract_validator
from capabilities.mcp_host.limits import CODES as LIMIT_CODES
from capabilities.mcp_host.limits import PACK_UNAVAILABLE

VERIFIED = ("verified", "service_ack")


@dataclass
class Normalized:
    receipt: dict[str, Any]
    violations: list[str] = field(default_factory=list)
    contradictions: list[str] = field(default_factory=list)


def schema_errors(raw: Any) -> list[str]:
    validator = contract_validator("receipt.v1.schema.json")
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or 'receipt'}: {e.message}"
        for e in sorted(validator.iter_errors(raw), key=lambda e: list(e.absolute_path))
    ]


def unknown_receipt(reason: str, tool: ToolDecl | None) -> dict[str, Any]:
    return {
        "receipt_schema": 1,
        "status": "unknown",
        "unknowns": [reason],
        "next": {"retry": "after_check", "check_with": tool.check_with if tool else None},
    }


def normalize(raw: Any, *, tool: ToolDecl | None, category: str | None, transport_error: str | None = None) -> Normalized:
    if transport_error is not None:
        code, _, detail = transport_error.partition(": ")
        if code == PACK_UNAVAILABLE:
            summary = f"not executed: {detail}"[:2000]
            return Normalized({
                "receipt_schema": 1, "status": "failed", "summary": summary, "error": {"code": code, "message": detail[:1000]},
                "next": {"retry": "allowed"},
            })
        lost = unknown_receipt(f"the tool's result was lost ({transport_error})", tool)
        if code in LIMIT_CODES.values():
            lost["error"] = {"code": code, "message": detail[:1000]}
        return Normalized(lost, [f"invalid_receipt: {transport_error}"])
    errors = schema_errors(raw)
    if errors:
        return Normalized(unknown_receipt("the tool's result was not a valid receipt", tool), [f"invalid_receipt: {e}" for e in errors[:5]])
    receipt = copy.deepcopy(raw)
    out = Normalized(receipt)
    nxt = receipt.setdefault("next", {})

    if receipt["status"] == "rejected":
        receipt["status"] = "unknown"
        out.violations.append("pack_wrote_rejected: only the gateway may say a call was rejected")

    error_code = str(receipt.get("error", {}).get("code", "")).upper()
    if "TIMEOUT" in error_code or "DISCONNECTED" in error_code:
        if receipt["status"] != "unknown":
            out.violations.append(f"timeout_is_unknown: {error_code} proves nothing about the outcome")
        receipt["status"] = "unknown"
        nxt["retry"] = "after_check"
        if tool is not None and tool.check_with and not nxt.get("check_with"):
            nxt["check_with"] = tool.check_with

    kept = []
    for item in receipt.get("values", []):
        is_number = isinstance(item["value"], (int, float)) and not isinstance(item["value"], bool)
        if is_number and not item.get("unit"):
            out.violations.append(f"value_without_unit: {item['name']}")
            receipt.setdefault("unknowns", []).append(f"{item['name']} came without a unit, so it is not stated")
        else:
            kept.append(item)
    if "values" in receipt:
        receipt["values"] = kept

    effects = receipt.get("effects", [])
    for item in effects:
        if category is not None:
            item["category"] = category
        if str(item["action"]).strip().lower() == "send" and item["verification"] == "verified":
            item["verification"] = "service_ack"
            out.violations.append("send_verified_without_readback: a send is only a server's acceptance, never a delivery")
    if receipt["status"] == "succeeded":
        verified = sum(1 for e in effects if e["verification"] in VERIFIED)
        if effects and verified < len(effects):
            receipt["status"] = "partial" if verified else "unknown"
            out.contradictions.append(f"reported success, but {len(effects) - verified} of {len(effects)} effects are not verified")
        elif not effects and category not in (None, "observe"):
            receipt["status"] = "unknown"
            out.contradictions.append(f"reported success for a {category} action without any effect to show for it")
        if receipt["status"] == "unknown" and tool is not None and tool.check_with:
            nxt.setdefault("check_with", tool.check_with)
            nxt["retry"] = "after_check"
    if not nxt:
        receipt.pop("next")
    return out


def needs_check(receipt: dict[str, Any]) -> bool:
    """A last result that must be checked with a read tool before the call may run again."""
    return receipt["status"] in ("unknown", "partial") and receipt.get("next", {}).get("retry") == "after_check"
