"""Fake delivery: the real server's tools and receipts, against an in-memory carrier and an
in-memory platform.

It loads ``server/tools.py`` and replaces its ``fetch`` (the carrier) and ``call`` (the
platform's ``/internal/watches/parcels/``). The carrier knows ``CONTRACT-1`` (in transit)
and every ``DELIVERED-*`` number (delivered), like tests/support/parcel_service.py; every other
number is unknown. The platform applies ``schedules.parcels``' rules: a number is 1-64
characters, following a followed number is the same watch, stopping a number never
followed is ``not_found``. Nothing leaves the process.
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path
from typing import Any

_SPEC = importlib.util.spec_from_file_location("yimi_pack_delivery_server_for_fake", Path(__file__).resolve().parent.parent / "server" / "tools.py")
assert _SPEC is not None and _SPEC.loader is not None
server = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = server
_SPEC.loader.exec_module(server)

TOOLS = server.TOOLS
CARRIER = "Yimi Express"
NAMESPACE = uuid.UUID("3a6f1c2e-5d4b-4e8f-9a1c-7b2d0e6f4c18")
CREATED = "2026-01-01T00:00:00+00:00"


def fetch(number: str) -> dict[str, Any] | None:
    if number == "CONTRACT-1":
        return {"tracking_number": number, "carrier": CARRIER, "state": "in_transit", "last_event": "departed sorting center"}
    if number.startswith("DELIVERED-"):
        return {"tracking_number": number, "carrier": CARRIER, "state": "delivered", "last_event": "signed for"}
    return None


class FakePlatform:
    def __init__(self) -> None:
        self.watches: dict[str, dict[str, Any]] = {}

    @staticmethod
    def refuse(status: int, code: str, message: str) -> tuple[int, Any]:
        return status, {"error": {"code": code, "message": message}}

    def call(self, body: dict[str, Any]) -> tuple[int, Any]:
        action = body.get("action", "list")
        if action == "list":
            return 200, {"parcels": [dict(w) for w in self.watches.values() if w["active"]]}
        if action not in ("follow", "unfollow"):
            return self.refuse(400, "invalid_request", "action is list, follow or unfollow")
        number = body.get("tracking_number").strip() if isinstance(body.get("tracking_number"), str) else ""
        if not 1 <= len(number) <= 64:
            return self.refuse(400, "invalid_request", "tracking_number must be 1 to 64 characters")
        mine = [w for w in self.watches.values() if w["tracking_number"] == number]
        if action == "unfollow":
            if not mine:
                return self.refuse(404, "not_found", f"the parcel {number} is not followed")
            stopped = [w["watch_id"] for w in mine if w["active"]]
            for w in mine:
                w["active"] = False
            return 200, {"stopped": stopped, "tracking_number": number}
        if body.get("state", "") not in ("", "not_delivered"):
            return self.refuse(400, "invalid_request", "state is 'not_delivered' or empty (a delivered parcel is not followed)")
        active = [w for w in mine if w["active"]]
        if active:
            return 200, {"parcel": dict(active[0]), "created": False}
        watch_id = str(uuid.uuid5(NAMESPACE, f"{number}:{len(self.watches)}"))
        self.watches[watch_id] = {
            "tracking_number": number, "label": (body.get("label") or "").strip() or f"快递 {number}", "watch_id": watch_id,
            "last_state": body.get("state") or None, "last_checked_at": None, "active": True, "created_at": CREATED,
        }
        return 200, {"parcel": dict(self.watches[watch_id]), "created": True}


PLATFORM = FakePlatform()
server.fetch = fetch
server.call = PLATFORM.call
