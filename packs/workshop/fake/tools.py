"""Fake workshop: the real server's tools and receipts against an in-memory platform.

It loads ``server/tools.py`` and replaces its ``call``. The fake platform knows two
installed packs (``delivery`` and ``schedule``) and one skill (``unit-converter``, with a
local source); its MCP index is missing, as on a fresh install. It checks a spec as the
platform does in outline (name, description, tools, adapter or reuse, a non-empty
contract, no ``spend``/``self_change``) and records a build as ``queued``. Its one
Yimi-built pack online is ``parcel-notes`` (1.1.0 over 1.0.0) for ``pack_revert``; the
shipped packs are refused as the platform refuses them. Nothing leaves the process and
nothing is built.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import uuid
from pathlib import Path
from typing import Any

_SPEC = importlib.util.spec_from_file_location("yimi_pack_workshop_server_for_fake", Path(__file__).resolve().parent.parent / "server" / "tools.py")
assert _SPEC is not None and _SPEC.loader is not None
server = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = server
_SPEC.loader.exec_module(server)

TOOLS = server.TOOLS
ENTRIES = [
    {"source": "packs", "id": "delivery", "name": "delivery", "description": "Parcels by tracking number.", "action": "use", "enabled": True,
     "tools": [{"name": "delivery__track", "description": "Track a parcel."}], "keywords": "parcel track delivery"},
    {"source": "packs", "id": "schedule", "name": "schedule", "description": "Reminders.", "action": "use", "enabled": True,
     "tools": [{"name": "schedule__create_reminder", "description": "Create a reminder."}], "keywords": "remind reminder"},
    {"source": "skills", "id": "unit-converter", "name": "Unit converter", "description": "Convert units.", "action": "reuse",
     "tools": [{"name": "convert", "description": "Convert."}], "keywords": "convert units mile"},
]
SOURCES = [
    {"name": "packs", "status": "ok", "error": None, "entries": 2, "skipped": 0},
    {"name": "skills", "status": "ok", "error": None, "entries": 1, "skipped": 0},
    {"name": "mcp", "status": "unavailable", "error": "no index file mcp-index.json (the deployer refreshes it)", "entries": 0, "skipped": 0},
]
NAME = re.compile(r"^[a-z](?:[a-z0-9]|_(?!_)|-(?!-)){1,31}$")
BUILDS: list[dict[str, Any]] = []
SHIPPED = {"delivery", "schedule", "workshop"}
BUILT = {"parcel-notes": [{"version": "1.0.0", "digest": "1" * 64}, {"version": "1.1.0", "digest": "2" * 64}]}  # oldest first


def refuse(status: int, code: str, message: str) -> tuple[int, Any]:
    return status, {"error": {"code": code, "message": message}}


def spec_problem(spec: Any) -> str | None:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not NAME.match(spec["name"]):
        return "name is required (the manifest's rules)"
    if not isinstance(spec.get("tools"), dict) or not spec["tools"] or not isinstance(spec.get("description"), str):
        return "description and tools are required"
    effects = [e for decl in spec["tools"].values() if isinstance(decl, dict)
               for e in [decl.get("effect"), *(decl.get("effect_by_arg", {}).get("map", {}).values())]]
    if "spend" in effects or "self_change" in effects:
        return "the manifest would be invalid: a yimi-maintained pack may not declare spend or self_change"
    if not spec.get("adapter") and not spec.get("reuse"):
        return "adapter is the tools' code (server/tools.py), or reuse names what is reused"
    if not isinstance(spec.get("contract"), dict) or not spec["contract"].get("cases"):
        return "contract needs a non-empty list of cases (the contract format of capabilities/contract.py)"
    return None


def call(body: dict[str, Any]) -> tuple[int, Any]:
    action = body.get("action")
    if action == "find":
        query = body.get("query")
        if not isinstance(query, str) or not query.strip() or len(query) > 200:
            return refuse(400, "invalid_request", "query is a non-empty text of at most 200 characters")
        words = [w for w in re.findall(r"[a-z0-9]+", query.lower()) if len(w) > 2]
        hits = [{k: v for k, v in e.items() if k != "keywords"} for e in ENTRIES if any(w in e["keywords"] for w in words)]
        return 200, {"query": query, "terms": words, "results": hits, "sources": SOURCES}
    if action == "build":
        problem = spec_problem(body.get("spec"))
        if problem:
            return refuse(400, "invalid_spec", problem)
        made = {"id": str(uuid.uuid4()), "name": body["spec"]["name"], "state": "queued", "attempts": 0, "max_attempts": 3,
                "error_code": "", "error_message": "", "candidate_digest": "", "candidate_state": "", "log_tail": "",
                "created_at": "2026-01-01T00:00:00+00:00", "published": None}
        BUILDS.insert(0, made)
        return 200, {"build": dict(made)}
    if action == "builds":
        wanted = body.get("build_id")
        if wanted is None:
            return 200, {"builds": [dict(b) for b in BUILDS[:10]]}
        found = [dict(b) for b in BUILDS if b["id"] == wanted]
        return (200, {"builds": found}) if found else refuse(404, "not_found", f"no build {wanted}")
    if action == "revert":
        return revert(body.get("name"), body.get("digest"))
    return refuse(400, "invalid_request", "action is find, build, builds or revert")


def revert(name: Any, digest: Any) -> tuple[int, Any]:
    if not isinstance(name, str) or not name or len(name) > 64:
        return refuse(400, "invalid_request", "name is the pack's name")
    if name in SHIPPED:
        return refuse(400, "not_yimi_built", f"{name} is a shipped pack: it changes with a release, not with a revert")
    versions = BUILT.get(name)
    if not versions:
        return refuse(400, "nothing_to_revert", f"no version of {name!r} that Yimi built is online")
    if digest is not None and digest != versions[-1]["digest"]:
        return refuse(400, "online_version_changed", "the version online is another one")
    gone = versions.pop()
    online = dict(versions[-1]) if versions else None
    return 200, {"revert": {"pack": name, "reverted": dict(gone), "online": online, "removed": online is None}}


server.call = call
