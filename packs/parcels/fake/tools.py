"""Fake parcels: the same tool and receipts, from an in-memory carrier.

``CONTRACT-1`` is in transit; any number starting ``DELIVERED-`` is delivered; every other
number is unknown (``not_found``). Nothing leaves the process.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from capabilities.packkit import ToolRegistry

_spec = importlib.util.spec_from_file_location("parcels_server_tools", Path(__file__).resolve().parent.parent / "server" / "tools.py")
assert _spec is not None and _spec.loader is not None
_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_server)

TOOLS = ToolRegistry()
CARRIER = "Yimi Express"


def lookup(number: str) -> dict[str, Any] | None:
    if number == "CONTRACT-1":
        return {"tracking_number": number, "carrier": CARRIER, "state": "in_transit", "last_event": "departed sorting center"}
    if number.startswith("DELIVERED-"):
        return {"tracking_number": number, "carrier": CARRIER, "state": "delivered", "last_event": "signed for"}
    return None


@TOOLS("Track a parcel by its tracking number.", _server.SCHEMA)
def track(args: dict[str, Any]) -> dict[str, Any]:
    number = _server.number_of(args)
    if number is None:
        return _server.invalid()
    body = lookup(number)
    return _server.not_found(number) if body is None else _server.tracked(body)
