"""The model_settings pack: read the model roles and draft a change, through the platform.

The platform (``llm.roles``, ``llm.role_drafts``) is the only authority; this server
only calls its internal endpoints (``/internal/model-settings/...`` on the platform socket,
``YIMI_PLATFORM_SOCKET``, through ``packkit.platform_call``) with the capability of the
call it is executing. It can read and draft; there is no endpoint that applies a draft:
only the owner's device confirms one (``model.draft.confirm``). A connection that fails or
times out is ``DISCONNECTED`` or ``TIMEOUT`` with status ``unknown``.

Receipts never carry a provider key: the platform sends only "set"/"not set" for a role
and "new key"/"unchanged" for a draft. The fake (``fake/tools.py``) keeps the same rules
in memory.
"""

from __future__ import annotations

from typing import Any

from capabilities.packkit import PlatformLost, PlatformNotConfigured, ToolRegistry, effect, platform_call, receipt, value

TOOLS = ToolRegistry()
SOURCE = "yimi model settings"

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
DRAFT_FIELDS = ("role", "provider", "base_url", "model", "options", "note", "idempotency_key")
CONFIRM_TEXT = "Nothing changed yet: the owner confirms this draft on a device; it takes effect from the next run."


def call(method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """One request to ``/internal/model-settings/<path>``."""
    return platform_call(method, "model-settings/" + path, body)


def refuse(code: str, message: str, retry: str = "forbidden") -> dict[str, Any]:
    return receipt("failed", summary=message, retry=retry, error=(code, message[:1000]))


def lost(exc: PlatformLost, doubt: str) -> dict[str, Any]:
    return receipt("unknown", summary=str(exc), unknowns=[doubt], retry="after_check", check_with="read", error=(exc.code, str(exc)))


def http_failure(status: int, payload: Any, *, changes: bool) -> dict[str, Any]:
    error = payload.get("error") if isinstance(payload, dict) else None
    code = str(error.get("code")) if isinstance(error, dict) and error.get("code") else f"http_{status}"
    message = str(error.get("message", "")) if isinstance(error, dict) else f"the platform answered HTTP {status}"
    if status >= 500 and changes:
        return receipt("unknown", summary=f"the platform failed during the call (HTTP {status})", unknowns=["whether the draft was made"],
                       retry="after_check", check_with="read", error=(code, message[:1000]))
    return refuse(code, message or code, retry="allowed" if status >= 500 or status == 429 else "forbidden")


def draft_receipt(draft: dict[str, Any], replayed: bool) -> dict[str, Any]:
    summary = (f"drafted {draft['role']} → {draft['provider']} {draft['model']} (draft {draft['id'][:8]}, open)"
               + (" (drafted by the earlier call)" if replayed else "") + ". " + CONFIRM_TEXT)
    return receipt(
        "succeeded", summary=summary, effects=[effect(f"model_draft:{draft['id']}", "draft", "service_ack")],
        content={"items": [draft], "text": CONFIRM_TEXT},
        values=[value("draft_state", draft["state"], None, SOURCE), value("applied", False, None, SOURCE),
                value("replayed", replayed, None, SOURCE)],
    )


@TOOLS("List the model roles (provider, model, base URL, where each setting came from, whether a key is set; never a key) and the open drafts.", READ_SCHEMA)
def read(args: dict[str, Any]) -> dict[str, Any]:
    try:
        status, payload = call("GET", "")
    except PlatformNotConfigured as exc:
        return refuse("not_configured", str(exc))
    except PlatformLost as exc:
        return lost(exc, "what the model settings are")
    if status != 200 or not isinstance(payload, dict) or not isinstance(payload.get("roles"), list):
        return http_failure(status, payload, changes=False)
    items, drafts = payload["roles"], payload.get("open_drafts") or []
    configured = sum(1 for r in items if r.get("configured"))
    return receipt("succeeded", summary=f"{configured} of {len(items)} model roles configured; {len(drafts)} open drafts",
                   content={"items": items, "open_drafts": drafts},
                   values=[value("roles_configured", configured, "role", SOURCE), value("open_drafts", len(drafts), "draft", SOURCE)])


@TOOLS("Draft a change of one model role (provider, base URL, model, options; fields left out stay as they are). The owner confirms it on a device; it is never applied by this tool.", DRAFT_SCHEMA)
def draft(args: dict[str, Any]) -> dict[str, Any]:
    if "api_key" in args or "key" in args:
        return refuse("invalid_request", "Yimi cannot set provider keys: the owner enters a key in the console's draft form")
    body = {k: args[k] for k in DRAFT_FIELDS if k in args}
    try:
        status, payload = call("POST", "drafts/", body)
    except PlatformNotConfigured as exc:
        return refuse("not_configured", str(exc))
    except PlatformLost as exc:
        return lost(exc, "whether the draft was made")
    if status not in (200, 201) or not isinstance(payload, dict) or not isinstance(payload.get("draft"), dict):
        return http_failure(status, payload, changes=True)
    return draft_receipt(payload["draft"], not payload.get("created", True))
