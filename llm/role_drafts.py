"""Drafts of model-role changes: made by the owner (console) or by Yimi (the
``model_settings`` pack), probed once, and effective only when one of the owner's devices
confirms them with a signature.

The only code that writes ``ModelRoleDraft``. A draft:

- names a role and the proposed provider, base URL, model and options, and optionally a
  new provider key, sealed at once (``llm.keyring``, bound to the draft's id) and never
  stored, logged, shown or sent back in plaintext — only "new key" or "unchanged";
- records who made it (``owner_console`` | ``yimi``) and the role's own version it was
  made against (``base_version``; 0 when the role had no settings of its own);
- is probed before it is offered for confirmation (``probe_draft``: one chat completion
  with ``max_tokens`` 1 to the proposed endpoint and model, at most ``PROBE_TIMEOUT_SECONDS``);
  a failing probe is shown and can still be confirmed;
- becomes effective only through ``confirm_draft``: a signature of an active, non-guest
  device of the owner (the device authority registered with ``llm.model_settings``)
  over ``draft_confirm_message`` — the draft's id and ``draft_digest`` of its exact
  contents, the time, a single-use nonce and the device's attestation that it was unlocked
  (Face ID / Touch ID) when the owner confirmed. The platform verifies the signature; the
  attestation is the device's own signed statement, recorded as payments record
  ``unlocked``. Applying goes through ``llm.roles.apply(source="draft")``, so a run in
  progress keeps the versions it pinned and the change takes effect for the next run.

Nothing here applies a draft without a device: Yimi can draft and read, never confirm.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from django.conf import settings
from django.db import IntegrityError, close_old_connections, transaction
from django.utils import timezone

from accounts.services import is_owner_device
from llm import keyring, roles
from llm.model_settings import NONCE, SWITCH_MAX_SKEW_SECONDS, switch_signers
from llm.models import ModelRole, ModelRoleDraft
from yimi_project.errors import YimiError
from yimi_project.ids import uuid_or_nil
from yimi_project.logs import log_event

State = ModelRoleDraft.State
Probe = ModelRoleDraft.Probe
MESSAGE_VERSION = "yimi-model-draft-v1"
CONFIRM_MAX_SKEW_SECONDS = SWITCH_MAX_SKEW_SECONDS  # ±300 s, as a model switch
PROBE_TIMEOUT_SECONDS = 10.0
MAX_OPEN_DRAFTS = 20
# Roles whose endpoint is a chat completion the probe can ask; the others say so honestly.
PROBED_ROLES = ("brain", "delegation", "vision", "executor_fast", "executor_thorough", "workshop_repair")
UNSUPPORTED_PROBE = "probe not supported for this role (its endpoint is not a chat completion)"
ATTESTATION_METHOD = re.compile(r"^[a-z_]{1,32}$")
CREATORS = tuple(ModelRoleDraft.Creator.values)


def _key_aad(draft_id: Any) -> str:
    return f"yimi-model-draft:{draft_id}"


def canonical_contents(role: str, provider: str, base_url: str, model: str, options: Mapping[str, Any], key_change: str) -> str:
    """The draft's contents as the device shows and signs them: canonical JSON (sorted
    keys, no spaces, UTF-8), options with every default filled in. Never the key."""
    body = {"role": role, "provider": provider, "base_url": base_url, "model": model, "options": dict(options), "key": key_change}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def draft_digest(role: str, provider: str, base_url: str, model: str, options: Mapping[str, Any], key_change: str) -> str:
    return hashlib.sha256(canonical_contents(role, provider, base_url, model, options, key_change).encode()).hexdigest()


def draft_confirm_message(device_id: str, draft_id: str, digest: str, issued_at: int, nonce: str, method: str) -> bytes:
    """What the owner's device signs to confirm a draft (docs/protocol.md, ``model.draft.confirm``).
    The ``unlocked`` line is the device's statement that the owner unlocked it (``method``:
    ``face_id``, ``touch_id``, ...) when confirming."""
    return f"{MESSAGE_VERSION}\n{device_id}\n{draft_id}\n{digest}\n{issued_at}\n{nonce}\nunlocked\n{method}".encode()


# --- making a draft ------------------------------------------------------------------------------


def current_settings(role: str) -> dict[str, Any]:
    """What a draft that leaves fields out starts from: the role's own settings, else its
    fallback's (never the key)."""
    try:
        row = roles.configured_row(role)
    except YimiError as exc:
        if exc.code != "role_not_configured":
            raise
        return {"provider": "", "base_url": "", "model": "", "options": dict(roles.DEFAULT_OPTIONS)}
    return {"provider": row.provider, "base_url": row.base_url, "model": row.model, "options": {**roles.DEFAULT_OPTIONS, **(row.options or {})}}


def create_draft(
    role: str,
    *,
    provider: str,
    base_url: str,
    model: str,
    options: Mapping[str, Any] | None,
    api_key: str | None = None,
    created_by: str,
    note: str = "",
    idempotency_key: str | None = None,
) -> tuple[ModelRoleDraft, bool]:
    """Make a draft; returns (draft, created). Nothing is applied.

    Steps: 1. validate as ``roles.apply`` would (bad input changes nothing); 2. a known
    ``idempotency_key`` returns that earlier draft (created False); 3. at most
    ``MAX_OPEN_DRAFTS`` open drafts; 4. insert the draft with the role's own version
    (``base_version``) and the digest; a new key is sealed in the same step, bound to the
    draft's id. The probe is the caller's next step (``probe_draft`` now, or
    ``dispatch_probe`` after commit).
    """
    if role not in roles.ROLES:
        raise YimiError("unknown_role", f"there is no model role {str(role)[:40]!r}; roles: {', '.join(roles.ROLES)}")
    if created_by not in CREATORS:
        raise YimiError("invalid_request", f"created_by must be one of {', '.join(CREATORS)}")
    if idempotency_key is not None and (not isinstance(idempotency_key, str) or not 1 <= len(idempotency_key) <= 64):
        raise YimiError("invalid_request", "idempotency_key must be a string of 1 to 64 characters")
    if idempotency_key:
        earlier = ModelRoleDraft.objects.filter(idempotency_key=idempotency_key).first()
        if earlier is not None:
            return earlier, False
    if not all(isinstance(v, str) for v in (provider, base_url, model)):
        raise YimiError("invalid_model_settings", "provider, base_url and model must be text")
    provider, base_url, model = provider.strip(), base_url.strip(), model.strip()
    roles._validate_endpoint(provider, base_url, model)  # the same rules as roles.apply
    clean = roles.validate_options(options)
    if api_key is not None and not isinstance(api_key, str):
        raise YimiError("invalid_model_settings", "api_key must be text")
    api_key = (api_key or "").strip() or None
    if not isinstance(note, str):
        note = ""
    key_change = ModelRoleDraft.KeyChange.NEW if api_key else ModelRoleDraft.KeyChange.UNCHANGED
    roles.ensure_imported()
    own = ModelRole.objects.filter(role=role).values_list("version", flat=True).first()
    draft = ModelRoleDraft(
        role=role, provider=provider, base_url=base_url, model=model, options=clean, key_change=key_change,
        digest=draft_digest(role, provider, base_url, model, clean, key_change), created_by=created_by,
        note=" ".join(note.split())[:300], idempotency_key=idempotency_key or None, base_version=own or 0,
        probe_status=Probe.PENDING if role in PROBED_ROLES else Probe.UNSUPPORTED,
        probe_message="" if role in PROBED_ROLES else UNSUPPORTED_PROBE,
    )
    try:
        with transaction.atomic():
            if api_key:  # sealed under the settings lock, so a master-key rotation re-wraps it or comes after
                roles.settings_lock()
                draft.api_key_encrypted = keyring.encrypt(api_key, _key_aad(draft.id))
            if ModelRoleDraft.objects.filter(state=State.OPEN).count() >= MAX_OPEN_DRAFTS:  # a soft bound
                raise YimiError("too_many_drafts", f"there are already {MAX_OPEN_DRAFTS} open drafts: confirm or discard some first")
            draft.save(force_insert=True)
    except IntegrityError:  # the same idempotency key, made concurrently
        earlier = ModelRoleDraft.objects.filter(idempotency_key=idempotency_key).first() if idempotency_key else None
        if earlier is None:
            raise
        return earlier, False
    log_event("model_draft_created", draft_id=str(draft.id), role=role, created_by=created_by, key_change=key_change)
    return draft, True


def get_draft(draft_id: Any) -> ModelRoleDraft:
    draft = ModelRoleDraft.objects.filter(id=uuid_or_nil(draft_id)).first()
    if draft is None:
        raise YimiError("not_found", "there is no such draft")
    return draft


def discard_draft(draft_id: Any, *, now: datetime | None = None) -> ModelRoleDraft:
    """open → discarded (conditional UPDATE); a draft no longer open is ``draft_closed``."""
    draft = get_draft(draft_id)
    if not ModelRoleDraft.objects.filter(id=draft.id, state=State.OPEN).update(state=State.DISCARDED, closed_at=now or timezone.now()):
        raise YimiError("draft_closed", f"this draft is {draft.state}, not open")
    draft.refresh_from_db()
    log_event("model_draft_discarded", draft_id=str(draft.id))
    return draft


# --- the probe -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeResult:
    status: str  # ok | failed | unsupported
    error_code: str = ""
    message: str = ""
    http_status: int | None = None
    latency_ms: int | None = None


def probe_key(draft: ModelRoleDraft) -> str | None:
    """The key the probe sends: the draft's new key, else the role's own stored key, but only
    to the endpoint that key already belongs to: a draft pointing at another host (Yimi's
    drafts never carry a key) is probed without one, so no stored key leaves for a host no
    device has confirmed."""
    if draft.api_key_encrypted:
        return keyring.decrypt(draft.api_key_encrypted, _key_aad(draft.id))
    row = ModelRole.objects.filter(role=draft.role).first()
    if row is not None and row.api_key_encrypted and row.base_url.rstrip("/") == draft.base_url.rstrip("/"):
        return keyring.decrypt(row.api_key_encrypted, roles.key_aad(row.role))
    return None


def run_probe(base_url: str, model: str, api_key: str | None, *, timeout: float = PROBE_TIMEOUT_SECONDS) -> ProbeResult:
    """One tiny, non-streaming chat completion (``max_tokens`` 1) to the endpoint."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    body = {"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1, "stream": False}
    url = base_url.rstrip("/") + "/chat/completions"
    started = time.monotonic()
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0))) as client:
            response = client.post(url, json=body, headers=headers)
    except httpx.TimeoutException:
        return ProbeResult("failed", "timeout", f"no answer within {timeout:g} s", None, int((time.monotonic() - started) * 1000))
    except httpx.TransportError as exc:
        return ProbeResult("failed", "unreachable", f"could not connect ({type(exc).__name__})", None, int((time.monotonic() - started) * 1000))
    latency = int((time.monotonic() - started) * 1000)
    if response.status_code != 200:
        code = {401: "unauthorized", 403: "forbidden", 404: "not_found", 429: "rate_limited"}.get(response.status_code, "http_error")
        return ProbeResult("failed", code, f"the endpoint answered HTTP {response.status_code}", response.status_code, latency)
    try:
        answer = response.json()
        ok = isinstance(answer, dict) and isinstance(answer.get("choices"), list)
    except ValueError:
        ok = False
    if not ok:
        return ProbeResult("failed", "not_a_completion", "the endpoint answered 200 without a chat completion", 200, latency)
    return ProbeResult("ok", "", "", 200, latency)


def probe_draft(draft_id: Any, *, now: datetime | None = None) -> ModelRoleDraft:
    """Probe an open draft's endpoint once and store the result on it (a later probe
    replaces an earlier one). Roles whose endpoint is not a chat completion are recorded
    ``unsupported`` without a request."""
    draft = get_draft(draft_id)
    if draft.state != State.OPEN:
        raise YimiError("draft_closed", f"this draft is {draft.state}, not open")
    if draft.role not in PROBED_ROLES:
        result = ProbeResult("unsupported", "", UNSUPPORTED_PROBE)
    else:
        try:
            key = probe_key(draft)
        except YimiError as exc:
            result = ProbeResult("failed", exc.code, exc.message[:300])
        else:
            result = run_probe(draft.base_url, draft.model, key)
    ModelRoleDraft.objects.filter(id=draft.id, state=State.OPEN).update(
        probe_status=result.status, probe_error_code=result.error_code, probe_message=result.message[:300],
        probe_http_status=result.http_status, probe_latency_ms=result.latency_ms, probed_at=now or timezone.now(),
    )
    draft.refresh_from_db()
    log_event("model_draft_probed", draft_id=str(draft.id), status=result.status, error_code=result.error_code,
              http_status=result.http_status, latency_ms=result.latency_ms)
    return draft


def dispatch_probe(draft_id: Any) -> None:
    """Probe after the current transaction commits, off the caller's path (the pack's
    call must not wait for a slow endpoint): on a Celery worker when a broker is
    configured, else on a background thread of this process."""

    def start() -> None:
        if settings.CELERY_BROKER_URL:
            from llm.tasks import probe_draft_task

            probe_draft_task.delay(str(draft_id))
        else:
            threading.Thread(target=_probe_in_thread, args=(str(draft_id),), daemon=True, name="draft-probe").start()

    transaction.on_commit(start)


def _probe_in_thread(draft_id: str) -> None:
    try:
        probe_draft(draft_id)
    except YimiError:
        pass
    finally:
        close_old_connections()


# --- confirming on a device ----------------------------------------------------------------------


@dataclass(frozen=True)
class SignedDraftConfirm:
    device_id: str
    draft_id: str
    digest: str
    issued_at: int
    nonce: str
    signature: str
    unlocked: bool
    method: str

    @classmethod
    def from_payload(cls, data: Any) -> SignedDraftConfirm:
        """From a ``model.draft.confirm`` frame (with the connection's ``device_id``)."""
        if not isinstance(data, dict):
            raise YimiError("invalid_request", "a draft confirmation is a JSON object")
        names = ("device_id", "draft_id", "digest", "nonce", "signature")
        missing = [n for n in names if not isinstance(data.get(n), str) or not data[n]]
        issued = data.get("issued_at")
        if isinstance(issued, str) and issued.isdigit():
            issued = int(issued)
        if isinstance(issued, bool) or not isinstance(issued, int):
            missing.append("issued_at")
        attestation = data.get("attestation")
        if not isinstance(attestation, dict):
            missing.append("attestation")
            attestation = {}
        if missing or not isinstance(issued, int):
            raise YimiError("invalid_request", f"missing or invalid fields: {', '.join(missing)}")
        method = attestation.get("method", "")
        if not isinstance(method, str) or not ATTESTATION_METHOD.match(method):
            raise YimiError("invalid_request", "attestation.method: how the device was unlocked, e.g. face_id or touch_id")
        return cls(**{n: data[n] for n in names}, issued_at=issued, unlocked=attestation.get("unlocked") is True, method=method)


def confirm_draft(signed: SignedDraftConfirm, *, now: datetime | None = None) -> ModelRoleDraft:
    """Apply a draft on the strength of a device signature.

    Steps: 1. the signer is an active, non-guest device of the owner (``forbidden``);
    2. ``issued_at`` within 5 minutes of the server clock (``confirm_expired``), a
    well-formed nonce, the device attests it was unlocked (``not_unlocked``); 3. the draft
    exists (``not_found``) and the digest signed is the draft's (``digest_mismatch``);
    4. the signature over ``draft_confirm_message`` verifies (``bad_signature``); 5. in
    one transaction, under ``roles.settings_lock`` and the draft's row lock: a nonce used
    before is ``confirm_replayed``, a draft no longer open ``draft_closed``, an unprobed
    one ``draft_not_probed``; the role's own version must still be ``base_version``, else
    the draft becomes ``stale`` and is refused (``draft_stale``); 6. ``roles.apply``
    (source ``draft``, the draft's key or KEEP) and the draft becomes ``confirmed`` with
    the device, nonce, message, signature and attestation. Any refusal changes no setting.
    """
    now = now or timezone.now()
    device = switch_signers().active(signed.device_id)
    if device is None:
        raise YimiError("forbidden", "a draft is confirmed only by one of the owner's active devices")
    if not is_owner_device(device):
        raise YimiError("forbidden", "only one of the owner's own (non-guest) devices can confirm a model draft")
    if abs(now.timestamp() - signed.issued_at) > CONFIRM_MAX_SKEW_SECONDS:
        raise YimiError("confirm_expired", "the signed confirmation is older than 5 minutes (or from the future)")
    if not NONCE.match(signed.nonce):
        raise YimiError("invalid_request", "nonce: 16-64 characters of letters, digits, '_' or '-'")
    if not signed.unlocked:
        raise YimiError("not_unlocked", "a draft is confirmed only on an unlocked device (Face ID / Touch ID)")
    draft = get_draft(signed.draft_id)
    if signed.digest != draft.digest:
        raise YimiError("digest_mismatch", "the digest signed is not this draft's: show the draft again and confirm what it says")
    message = draft_confirm_message(device.id, str(draft.id), draft.digest, signed.issued_at, signed.nonce, signed.method)
    if not device.verify(message, signed.signature):
        raise YimiError("bad_signature", "the signature over the draft confirmation does not match the device key")
    stale = False
    with transaction.atomic():
        roles.ensure_imported()
        roles.settings_lock()
        if ModelRoleDraft.objects.filter(confirm_nonce=signed.nonce).exists():
            raise YimiError("confirm_replayed", "this signed confirmation was already used")
        draft = ModelRoleDraft.objects.select_for_update().get(id=draft.id)
        if draft.state != State.OPEN:
            raise YimiError("draft_closed", f"this draft is {draft.state}, not open")
        if draft.probe_status == Probe.PENDING:
            raise YimiError("draft_not_probed", "this draft has not been probed yet: probe it before confirming")
        row = ModelRole.objects.select_for_update().filter(role=draft.role).first()
        if (row.version if row is not None else 0) != draft.base_version:
            draft.state, draft.closed_at = State.STALE, now
            draft.save(update_fields=["state", "closed_at"])
            stale = True
        else:
            key = keyring.decrypt(draft.api_key_encrypted, _key_aad(draft.id)) if draft.api_key_encrypted else roles.KEEP
            applied = roles.apply(
                draft.role, provider=draft.provider, base_url=draft.base_url, model=draft.model, options=draft.options,
                api_key=key, source="draft", note=f"draft {str(draft.id)[:8]}, confirmed on {device.name}"[:200],
            )
            try:
                with transaction.atomic():
                    ModelRoleDraft.objects.filter(id=draft.id).update(
                        state=State.CONFIRMED, closed_at=now, confirmed_device_id=device.id, confirm_nonce=signed.nonce,
                        confirm_issued_at=datetime.fromtimestamp(signed.issued_at, tz=UTC), confirm_message=message.decode(),
                        confirm_signature=signed.signature, attestation={"unlocked": True, "method": signed.method},
                        applied_version=applied.version,
                    )
            except IntegrityError:
                raise YimiError("confirm_replayed", "this signed confirmation was already used") from None
    if stale:
        log_event("model_draft_stale", draft_id=str(draft.id), role=draft.role)
        raise YimiError("draft_stale", f"the {draft.role} settings changed after this draft was made: make a new draft")
    draft.refresh_from_db()
    log_event("model_draft_confirmed", draft_id=str(draft.id), role=draft.role, version=draft.applied_version, device_id=device.id)
    return draft


# --- reading: the console, the devices, the pack -------------------------------------------------


def serialize_draft(draft: ModelRoleDraft) -> dict[str, Any]:
    """A draft as devices, the pack and the console see it: never the key, only
    ``key``: "new key" or "unchanged"."""
    return {
        "id": str(draft.id), "role": draft.role, "provider": draft.provider, "base_url": draft.base_url, "model": draft.model,
        "options": draft.options, "key": draft.key_change, "digest": draft.digest, "state": draft.state,
        "created_by": draft.created_by, "note": draft.note, "base_version": draft.base_version,
        "created_at": draft.created_at.isoformat(),
        "probe": {"status": draft.probe_status, "error_code": draft.probe_error_code, "message": draft.probe_message,
                  "http_status": draft.probe_http_status, "latency_ms": draft.probe_latency_ms,
                  "probed_at": draft.probed_at.isoformat() if draft.probed_at else None},
        "applied_version": draft.applied_version,
    }


def offered_drafts() -> list[ModelRoleDraft]:
    """Open drafts that have been probed: what a device is offered to confirm."""
    return list(ModelRoleDraft.objects.filter(state=State.OPEN).exclude(probe_status=Probe.PENDING).order_by("created_at"))


def read_settings() -> dict[str, Any]:
    """The roles as the pack's ``read`` sees them (provider, model, base URL, source;
    never a key), and the open drafts."""
    items = [
        {"role": r.role, "configured": r.configured, "provider": r.provider, "model": r.model, "base_url": r.base_url,
         "source": r.source, "source_text": r.source_text, "key": r.key_state, "version": r.version}
        for r in roles.overview()
    ]
    drafts = [serialize_draft(d) for d in ModelRoleDraft.objects.filter(state=State.OPEN).order_by("created_at")]
    return {"roles": items, "open_drafts": drafts}


def rewrap_draft_keys(old: bytes, new: bytes) -> int:
    """Re-seal open drafts' new keys under a new master key (for the master-key rotation,
    inside its transaction); returns how many were re-sealed."""
    count = 0
    for draft in ModelRoleDraft.objects.select_for_update().filter(state=State.OPEN).exclude(api_key_encrypted=None):
        assert draft.api_key_encrypted is not None
        plain = keyring.decrypt(draft.api_key_encrypted, _key_aad(draft.id), key=old)
        draft.api_key_encrypted = keyring.encrypt(plain, _key_aad(draft.id), key=new)
        draft.save(update_fields=["api_key_encrypted"])
        count += 1
    return count
