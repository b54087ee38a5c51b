"""Fake release pack: the real server's tools and receipts, against an in-memory platform.

It loads ``server/tools.py`` and replaces its ``call`` with ``FakePlatform.call``, which
applies the platform's rules (``releases.requested``): a reason is required, one request
waits at a time (a second while it waits is the same one), and a status reads the latest
or the one asked for. Nothing is ever executed: the fake has no releases.
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path
from typing import Any

_SPEC = importlib.util.spec_from_file_location("yimi_pack_release_server_for_fake", Path(__file__).resolve().parent.parent / "server" / "tools.py")
assert _SPEC is not None and _SPEC.loader is not None
server = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = server
_SPEC.loader.exec_module(server)

TOOLS = server.TOOLS
NAMESPACE = uuid.UUID("5d1c7a0e-2f43-4b8e-9a61-3e0b7c2d4f18")
CREATED = "2026-01-01T00:00:00+00:00"


class FakePlatform:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        body = body or {}
        if method != "POST" or path not in ("rollback/", "status/"):
            return 404, {"error": {"code": "not_found", "message": "no such endpoint"}}
        if path == "rollback/":
            reason = body.get("reason")
            if not isinstance(reason, str) or not reason.strip():
                return 400, {"error": {"code": "invalid_request", "message": "say why (the owner's own words are the reason)"}}
            waiting = next((r for r in self.requests if r["state"] == "pending"), None)
            if waiting is not None:
                return 200, waiting
            made = {"request_id": str(uuid.uuid5(NAMESPACE, f"fake:{len(self.requests)}")), "state": "pending", "reason": reason.strip(),
                    "from_build": "dir:fake-current", "to_build": "", "state_reason": "", "requested_at": CREATED, "decided_at": None}
            self.requests.append(made)
            return 200, made
        found = [r for r in self.requests if not body.get("request_id") or r["request_id"] == body["request_id"]]
        if not found:
            return 404, {"error": {"code": "not_found", "message": "there is no such rollback request"}}
        return 200, found[-1]


PLATFORM = FakePlatform()
server.call = PLATFORM.call
