"""Fake health: the real server's ``read`` and its receipts, against in-memory records.

It loads ``server/tools.py`` and replaces its ``call`` with ``FakePlatform.call``, which
applies the platform's rules (``memory.personal.health.read``): records starting in [after, before)
(ISO 8601 with a time zone, else ``invalid_request``), an optional kind, newest first, at
most ``limit`` (1-100). Two records: a daily summary of 2026-01-01 from the phone and a
ride on 2026-01-02 from the watch.
"""

from __future__ import annotations

import importlib.util
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

_SPEC = importlib.util.spec_from_file_location("yimi_pack_health_server_for_fake", Path(__file__).resolve().parent.parent / "server" / "tools.py")
assert _SPEC is not None and _SPEC.loader is not None
server = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = server
_SPEC.loader.exec_module(server)

TOOLS = server.TOOLS
RECORDS = [
    {"id": "00000000-0000-4000-8000-0000000000b2", "kind": "cycling", "start": "2026-01-02T07:30:00+00:00", "end": "2026-01-02T08:15:00+00:00",
     "duration_s": 2700, "metrics": {"distance_m": 15200, "avg_heart_rate_bpm": 132, "active_energy_kcal": 410.5}, "device": "fake watch"},
    {"id": "00000000-0000-4000-8000-0000000000b1", "kind": "daily_summary", "start": "2026-01-01T00:00:00+00:00", "end": "2026-01-01T23:59:59+00:00",
     "duration_s": 86399, "metrics": {"steps": 8421, "resting_heart_rate_bpm": 58, "sleep_minutes": 412}, "device": "fake phone"},
]


def instant(value: Any, name: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise ValueError(f"{name} must be an ISO 8601 time with a time zone")
    return parsed


def call(path: str, body: dict[str, Any]) -> tuple[int, Any]:
    if path != "read/":
        return 404, {"error": {"code": "not_found", "message": "no such endpoint"}}
    try:
        rows = list(RECORDS)
        if body.get("after") is not None:
            after = instant(body["after"], "after")
            rows = [r for r in rows if datetime.fromisoformat(r["start"]) >= after]
        if body.get("before") is not None:
            before = instant(body["before"], "before")
            rows = [r for r in rows if datetime.fromisoformat(r["start"]) < before]
    except ValueError as exc:
        return 400, {"error": {"code": "invalid_request", "message": str(exc)}}
    if body.get("kind") is not None:
        if body["kind"] not in server.KINDS:
            return 400, {"error": {"code": "invalid_request", "message": "unknown kind"}}
        rows = [r for r in rows if r["kind"] == body["kind"]]
    limit = body.get("limit", 50)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100:
        return 400, {"error": {"code": "invalid_request", "message": "limit is 1 to 100"}}
    return 200, {"records": rows[:limit], "count": len(rows[:limit])}


server.call = call
