"""Fake model_settings: the same tools and receipts, with the roles and drafts in memory.

It applies the platform's rules (``llm.roles``, ``llm.role_drafts``): known roles only,
an http(s) base URL with a host and no credentials, provider 1-64 and model 1-200
characters, only the known options; fields left out are the role's current ones; the
idempotency key returns the earlier draft; Yimi never sets a key; a draft stays open
(nothing here confirms or applies it). The brain role starts as the demo brain.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from capabilities.packkit import ToolRegistry, effect, receipt, value

TOOLS = ToolRegistry()
SOURCE = "yimi model settings"
ROLES = ("brain", "delegation", "vision", "executor_fast", "executor_thorough", "realtime", "tts", "asr_remote", "workshop_repair")
FALLBACK = {"delegation": "brain", "executor_fast": "brain", "executor_thorough": "brain", "workshop_repair": "brain"}
PROBED = ("brain", "delegation", "vision", "executor_fast", "executor_thorough", "workshop_repair")
DEFAULT_OPTIONS: dict[str, Any] = {"thinking_field": "", "timeout_seconds": 60.0, "connect_timeout_seconds": 5.0, "max_tokens": None,
                                   "include_usage": True, "estimate_usage": False}
CONFIRM_TEXT = "Nothing changed yet: the owner confirms this draft on a device; it takes effect from the next run."
ROLE_ROWS: dict[str, dict[str, Any]] = {
    "brain": {"provider": "demo", "base_url": "http://127.0.0.1:8765/v1", "model": "yimi-demo", "options": dict(DEFAULT_OPTIONS),
              "source": "environment", "source_text": "imported from the environment at first start (demo brain)", "key": "not set", "version": 1},
}
DRAFTS: dict[str, dict[str, Any]] = {}
KEYS: dict[str, str] = {}

READ_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
DRAFT_SCHEMA = {
    "type": "object",
    "properties": {
        "role": {"type": "string", "description": "brain, delegation, vision, executor_fast, executor_thorough, realtime, tts, asr_remote or workshop_repair"},
        "provider": {"type": "string", "maxLength": 64},
        "base_url": {"type": "string", "maxLength": 500, "description": "the OpenAI-compatible /v1 root"},
        "model": {"type": "string", "maxLength": 200},
        "options": {"type": "object", "description": "thinking_field, timeout_seconds, connect_timeout_seconds, max_tokens, include_usage, estimate_usage"},
        "note": {"type": "string", "maxLength": 300, "description": "why, in the owner's words"},
        "idempotency_key": {"type": "string", "maxLength": 64},
    },
    "required": ["role"],
}


def refuse(code: str, message: str) -> dict[str, Any]:
    return receipt("failed", summary=message, retry="forbidden", error=(code, message))


def _current(role: str) -> dict[str, Any]:
    row = ROLE_ROWS.get(role) or ROLE_ROWS.get(FALLBACK.get(role, ""))
    if row is None:
        return {"provider": "", "base_url": "", "model": "", "options": dict(DEFAULT_OPTIONS)}
    return row


def _problem(provider: Any, base_url: Any, model: Any, options: Any) -> str | None:
    if not all(isinstance(v, str) for v in (provider, base_url, model)):
        return "provider, base_url and model must be text"
    if not provider.strip() or len(provider) > 64:
        return "provider must be a name of 1 to 64 characters"
    parts = urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or len(base_url) > 500:
        return "base_url must be an http:// or https:// URL (the OpenAI-compatible /v1 root)"
    if parts.username or parts.password:
        return "base_url must not carry credentials; the key is stored on its own"
    if not model.strip() or len(model) > 200:
        return "model must be a name of 1 to 200 characters"
    if not isinstance(options, dict):
        return "options must be an object"
    unknown = set(options) - set(DEFAULT_OPTIONS)
    if unknown:
        return f"unknown option(s): {', '.join(sorted(unknown))}"
    return None


@TOOLS("List the model roles (provider, model, base URL, where each setting came from, whether a key is set; never a key) and the open drafts.", READ_SCHEMA)
def read(args: dict[str, Any]) -> dict[str, Any]:
    items = []
    for role in ROLES:
        row = ROLE_ROWS.get(role)
        if row is None:
            fallback = FALLBACK.get(role)
            text = f"not configured: uses {fallback}" if fallback in ROLE_ROWS else "not configured"
            items.append({"role": role, "configured": False, "provider": "", "model": "", "base_url": "", "source": "",
                          "source_text": text, "key": "—", "version": None})
        else:
            items.append({"role": role, "configured": True, **{k: row[k] for k in ("provider", "model", "base_url", "source", "source_text", "key", "version")}})
    drafts = [dict(d) for d in DRAFTS.values() if d["state"] == "open"]
    configured = sum(1 for r in items if r["configured"])
    return receipt("succeeded", summary=f"{configured} of {len(items)} model roles configured; {len(drafts)} open drafts",
                   content={"items": items, "open_drafts": drafts},
                   values=[value("roles_configured", configured, "role", SOURCE), value("open_drafts", len(drafts), "draft", SOURCE)])


@TOOLS("Draft a change of one model role (provider, base URL, model, options; fields left out stay as they are). The owner confirms it on a device; it is never applied by this tool.", DRAFT_SCHEMA)
def draft(args: dict[str, Any]) -> dict[str, Any]:
    if "api_key" in args or "key" in args:
        return refuse("invalid_request", "Yimi cannot set provider keys: the owner enters a key in the console's draft form")
    role, key = args.get("role"), args.get("idempotency_key")
    if not isinstance(role, str):
        return refuse("invalid_request", "role is required")
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= 64):
        return refuse("invalid_request", "idempotency_key must be a string of 1 to 64 characters")
    replayed = key is not None and key in KEYS
    if replayed:
        made = DRAFTS[KEYS[key]]
    else:
        if role not in ROLES:
            return refuse("unknown_role", f"there is no model role {role[:40]!r}; roles: {', '.join(ROLES)}")
        current = _current(role)
        provider, base_url, model = (args.get(k, current[k]) for k in ("provider", "base_url", "model"))
        options = args.get("options", {})
        problem = _problem(provider, base_url, model, options)
        if problem:
            return refuse("invalid_model_settings", problem)
        merged = {**DEFAULT_OPTIONS, **current["options"], **{k: v for k, v in options.items() if v is not None}}
        for name in ("timeout_seconds", "connect_timeout_seconds"):
            if isinstance(merged[name], bool) or not isinstance(merged[name], int | float) or not 0 < merged[name] <= 600:
                return refuse("invalid_model_settings", f"{name} must be a number of seconds above 0 and at most 600")
            merged[name] = float(merged[name])
        canonical = json.dumps({"role": role, "provider": provider.strip(), "base_url": base_url.strip(), "model": model.strip(),
                                "options": merged, "key": "unchanged"}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        note = args.get("note", "")
        made = {
            "id": str(uuid.uuid4()), "role": role, "provider": provider.strip(), "base_url": base_url.strip(), "model": model.strip(),
            "options": merged, "key": "unchanged", "digest": hashlib.sha256(canonical.encode()).hexdigest(), "state": "open",
            "created_by": "yimi", "note": " ".join(note.split())[:300] if isinstance(note, str) else "",
            "base_version": ROLE_ROWS.get(role, {}).get("version", 0), "created_at": datetime.now(UTC).isoformat(),
            "probe": {"status": "pending" if role in PROBED else "unsupported", "error_code": "", "message": "", "http_status": None,
                      "latency_ms": None, "probed_at": None},
            "applied_version": None,
        }
        DRAFTS[made["id"]] = made
        if key is not None:
            KEYS[key] = made["id"]
    summary = (f"drafted {made['role']} → {made['provider']} {made['model']} (draft {made['id'][:8]}, open)"
               + (" (drafted by the earlier call)" if replayed else "") + ". " + CONFIRM_TEXT)
    return receipt("succeeded", summary=summary, effects=[effect(f"model_draft:{made['id']}", "draft", "service_ack")],
                   content={"items": [dict(made)], "text": CONFIRM_TEXT},
                   values=[value("draft_state", made["state"], None, SOURCE), value("applied", False, None, SOURCE),
                           value("replayed", replayed, None, SOURCE)])
