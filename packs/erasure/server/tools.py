"""The erasure pack: erase the owner's timeline entries for good, through the platform.

The platform (``memory.timeline.erasure``) is the only authority; this server calls
``/internal/erasure/{preview,erase,result}/`` on the platform socket with the capability
of the call it is executing: an erase needs a call the gateway decided as ``delete`` on
the same ``preview_token``. A connection that fails or times out during an erase is
``unknown`` (check with ``result``): the platform may or may not have erased.

Receipts never repeat an entry's text beyond the preview's excerpts; an erase lists
exactly the timeline numbers, images and embedding rows erased and the copies redacted.
The fake (``fake/tools.py``) runs these same handlers against an in-memory platform.
"""

from __future__ import annotations

from typing import Any

from capabilities.packkit import PlatformLost, PlatformNotConfigured, ToolRegistry, effect, platform_call, receipt, value

TOOLS = ToolRegistry()
SOURCE = "yimi timeline"

PREVIEW_SCHEMA = {
    "type": "object",
    "properties": {
        "seqs": {"type": "array", "items": {"type": "integer", "minimum": 1}, "maxItems": 500, "description": "timeline numbers"},
        "after": {"type": "string", "description": "ISO 8601 time with a time zone: entries at or after it"},
        "before": {"type": "string", "description": "ISO 8601 time with a time zone: entries before it"},
        "text": {"type": "string", "minLength": 2, "maxLength": 500, "description": "entries whose text contains this"},
    },
}
ERASE_SCHEMA = {
    "type": "object",
    "properties": {"preview_token": {"type": "string", "minLength": 1, "maxLength": 8192, "description": "from preview"}},
    "required": ["preview_token"],
}
RESULT_SCHEMA = {
    "type": "object",
    "properties": {"preview_token": {"type": "string", "maxLength": 8192}, "erasure_id": {"type": "string", "maxLength": 64}},
}


def call(method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """One request to ``/internal/erasure/<path>``: (HTTP status, parsed JSON or None)."""
    return platform_call(method, "erasure/" + path, body)


def refuse(code: str, message: str, *, retry: str = "forbidden", check_with: str | None = None) -> dict[str, Any]:
    return receipt("failed", summary=message, retry=retry, check_with=check_with, error=(code, message[:1000]))


def failure(status: int, payload: Any, *, changes: bool) -> dict[str, Any]:
    error = payload.get("error") if isinstance(payload, dict) else None
    code = str(error.get("code")) if isinstance(error, dict) and error.get("code") else f"http_{status}"
    message = str(error.get("message", "")) if isinstance(error, dict) else f"the platform answered HTTP {status}"
    if status >= 500 and changes:
        return receipt("unknown", summary=f"the platform failed during the erasure (HTTP {status})", unknowns=["whether anything was erased"],
                       retry="after_check", check_with="result", error=(code, message[:1000]))
    return refuse(code, message or code, retry="allowed" if status >= 500 or status == 429 else "forbidden")


def erased_receipt(result: dict[str, Any], *, effects_of_this_call: bool = True) -> dict[str, Any]:
    entries, images = result.get("entries", []), result.get("images", [])
    redacted = result.get("redacted", {}) or {}
    replayed = bool(result.get("replayed"))
    originals = result.get("originals") or {}
    summary = f"erased {len(entries)} timeline entries, {len(images)} image originals and {result.get('embeddings', 0)} embeddings"
    if originals.get("erased"):
        summary += f", and {originals['erased']} raw recordings, images and events ({originals.get('cold_pending', 0)} cold copies still to be rewritten)"
    if replayed:
        summary += " (erased by the earlier call)"
    if not effects_of_this_call:
        summary = f"erasure {result.get('erasure_id')}: " + summary
    effects = [effect(f"timeline:{e['seq']}", "erase", "service_ack") for e in entries[:100]]
    effects += [effect(f"image:{i}", "erase", "service_ack") for i in images[:100]]
    if not effects_of_this_call:  # a read of an earlier erasure: its facts are values and content, not effects
        effects = []
    return receipt(
        "succeeded", summary=summary, effects=effects,
        values=[value("entries_erased", len(entries), "entry", SOURCE), value("images_erased", len(images), "image", SOURCE),
                value("embeddings_erased", result.get("embeddings", 0), "embedding", SOURCE),
                value("copies_redacted", sum(redacted.values()), "copy", SOURCE), value("replayed", replayed, None, SOURCE),
                value("originals_erased", int(originals.get("erased", 0)), "original", SOURCE),
                value("cold_copies_pending", int(originals.get("cold_pending", 0)), "original", SOURCE)],
        content={"erasure_id": result.get("erasure_id"), "digest": result.get("digest"), "items": entries, "images": images,
                 "redacted": redacted, "originals": originals, "not_erased": result.get("not_erased", [])},
        retry="forbidden",
    )


@TOOLS("Preview an erasure of timeline entries by timeline numbers (seqs), a time range (after/before) and/or a text match: lists exactly what would be erased and returns a preview_token.", PREVIEW_SCHEMA)
def preview(args: dict[str, Any]) -> dict[str, Any]:
    body = {k: args[k] for k in ("seqs", "after", "before", "text") if k in args}
    try:
        status, payload = call("POST", "preview/", body)
    except PlatformNotConfigured as exc:
        return refuse("not_configured", str(exc))
    except PlatformLost as exc:
        return receipt("unknown", summary=str(exc), unknowns=["what would be erased"], retry="allowed", error=(exc.code, str(exc)))
    if status != 200 or not isinstance(payload, dict) or "preview_token" not in payload:
        return failure(status, payload, changes=False)
    count = int(payload.get("count", 0))
    return receipt(
        "succeeded", summary=f"{count} timeline entries would be erased ({len(payload.get('images', []))} image originals, {payload.get('embeddings', 0)} embeddings)",
        values=[value("entries", count, "entry", SOURCE), value("images", len(payload.get("images", [])), "image", SOURCE),
                value("embeddings", payload.get("embeddings", 0), "embedding", SOURCE),
                value("originals", int((payload.get("originals") or {}).get("count", 0)), "original", SOURCE)],
        content={"preview_token": payload["preview_token"], "digest": payload.get("digest"), "items": payload.get("entries", []),
                 "images": payload.get("images", []), "originals": payload.get("originals") or {"count": 0, "by_kind": {}},
                 "expires_in_seconds": payload.get("expires_in_seconds")},
    )


@TOOLS("Erase exactly the entries a preview listed (by its preview_token), with their embeddings, image originals and copies; refused if the set changed since the preview.", ERASE_SCHEMA)
def erase(args: dict[str, Any]) -> dict[str, Any]:
    token = args.get("preview_token")
    if not isinstance(token, str) or not token:
        return refuse("invalid_request", "erase needs the preview_token of a preview")
    try:
        status, payload = call("POST", "erase/", {"preview_token": token})
    except PlatformNotConfigured as exc:
        return refuse("not_configured", str(exc))
    except PlatformLost as exc:
        return receipt("unknown", summary=str(exc), unknowns=["whether anything was erased"], retry="after_check", check_with="result",
                       error=(exc.code, str(exc)))
    if status != 200 or not isinstance(payload, dict) or "erasure_id" not in payload:
        return failure(status, payload, changes=True)
    return erased_receipt(payload)


@TOOLS("What an erasure erased, by its erasure_id or the preview_token it was made from.", RESULT_SCHEMA)
def result(args: dict[str, Any]) -> dict[str, Any]:
    body = {k: args[k] for k in ("preview_token", "erasure_id") if isinstance(args.get(k), str) and args[k]}
    if not body:
        return refuse("invalid_request", "give an erasure_id or a preview_token")
    try:
        status, payload = call("POST", "result/", body)
    except PlatformNotConfigured as exc:
        return refuse("not_configured", str(exc))
    except PlatformLost as exc:
        return receipt("unknown", summary=str(exc), unknowns=["what was erased"], retry="allowed", error=(exc.code, str(exc)))
    if status != 200 or not isinstance(payload, dict) or "erasure_id" not in payload:
        return failure(status, payload, changes=False)
    return erased_receipt(payload, effects_of_this_call=False)
