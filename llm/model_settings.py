"""Which local model is selected, which one is effective, and switching between them.

The only code that writes ``ModelSelection`` and ``ModelSwitch``. Per kind:

- ``asr``, ``vad``, ``wake_word``: a process fixes its model the first time it needs one
  (``process_model``) and keeps it; a switch is ``pending_restart`` until a process that
  starts afterwards loads the new model and marks it effective.
- ``voiceprint``: embeddings of two models cannot be compared, so the switch is
  ``needs_enrollment`` until every capture channel enrolled under the effective model has
  been enrolled again under the selected one (recalibrating: the new model's thresholds
  start at the floor); identification keeps using the effective model until then.
- ``embedding``: ``rebuilding`` until the Celery task ``devices.rebuild_vector_index`` has
  embedded the timeline with the new model (progress done/total); a failed rebuild keeps
  the old model effective and shows the error.
- ``face``: listed only; switching goes through face enrollment.

A switch must be signed on one of the owner's devices (``model_switch_message``): the
account's active devices (``accounts.models.Device``), each checking its own key.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts import signatures
from accounts.models import Device
from accounts.services import is_owner_device
from accounts.voiceprint import enrolled_channels
from llm import catalog
from llm.catalog import CatalogEntry
from llm.models import ModelSelection, ModelSwitch
from yimi_project.celery import app as celery_app
from yimi_project.errors import YimiError
from yimi_project.ids import uuid_or_nil
from yimi_project.logs import log_event

RESTART_KINDS = ("asr", "vad", "wake_word")
SWITCH_MAX_SKEW_SECONDS = 300
NONCE = re.compile(r"^[A-Za-z0-9_-]{16,64}$")
State = ModelSelection.State


def model_switch_message(device_id: str, kind: str, model_id: str, version: str, digest_summary: str, issued_at: int, nonce: str) -> bytes:
    """What the owner's device signs to switch a model. ``digest_summary`` binds the
    signature to the exact files (``CatalogEntry.digest_summary``)."""
    return f"yimi-model-switch-v1\n{device_id}\n{kind}\n{model_id}\n{version}\n{digest_summary}\n{issued_at}\n{nonce}".encode()


# --- who may sign: the owner's active devices -------------------------------------------------


@dataclass(frozen=True)
class SwitchSigner:
    """A device that may sign a switch. ``verify(message, signature)`` checks the device's
    signature over ``message``."""

    id: str
    name: str
    owner_id: int
    is_guest: bool
    verify: Callable[[bytes, str], bool] = field(repr=False, compare=False)


def _signer(device: Device) -> SwitchSigner:
    return SwitchSigner(
        id=str(device.id), name=device.name, owner_id=device.owner_id, is_guest=device.is_guest,
        verify=functools.partial(signatures.verify, device.public_key),
    )


class SwitchSigners:
    def active(self, device_id: str) -> SwitchSigner | None:
        """The active (not revoked) device with this id, of any account; None if none."""
        device = Device.objects.filter(id=uuid_or_nil(device_id), revoked_at=None).first()
        return _signer(device) if device is not None else None

    def of_owner(self, owner_id: int) -> list[SwitchSigner]:
        """The account's active, non-guest devices, by name (the settings page offers them)."""
        devices = Device.objects.filter(owner_id=owner_id, revoked_at=None, is_guest=False).order_by("name")
        return [_signer(device) for device in devices]


def switch_signers() -> SwitchSigners:
    return SwitchSigners()


# --- reading --------------------------------------------------------------------------------


def selection(kind: str) -> ModelSelection:
    """The kind's selection row, created from the catalog's default on first use.

    A new row's selected model is effective at once (nothing was effective before), except
    for ``embedding``, which first needs its index: that row starts ``rebuilding`` and the
    rebuild is dispatched after commit.
    """
    if kind not in catalog.KINDS:
        raise YimiError("unknown_model", f"unknown model kind {kind!r}")
    row = ModelSelection.objects.filter(kind=kind).first()
    if row is not None:
        return row
    default = catalog.load_catalog().default_for(kind)
    fields: dict[str, Any] = {"state": State.NONE}
    if kind == "face":
        fields["state"] = State.LISTED
    elif default is not None:
        fields.update(selected_id=default.id, selected_version=default.version)
        if kind == "embedding":
            fields["state"] = State.REBUILDING
        else:
            fields.update(effective_id=default.id, effective_version=default.version, state=State.EFFECTIVE)
    try:
        with transaction.atomic():
            row = ModelSelection.objects.create(kind=kind, **fields)
    except IntegrityError:
        return ModelSelection.objects.get(kind=kind)
    if row.state == State.REBUILDING:
        _dispatch_rebuild_after_commit(row.selected_id, row.selected_version)
    return row


def _entry(kind: str, model_id: str, version: str) -> CatalogEntry | None:
    return catalog.load_catalog().find(kind, model_id, version) if model_id else None


def selected_entry(kind: str) -> CatalogEntry | None:
    row = selection(kind)
    return _entry(kind, row.selected_id, row.selected_version)


def effective_entry(kind: str) -> CatalogEntry | None:
    """The effective model of a kind that switches without restart (voiceprint, embedding)."""
    row = selection(kind)
    return _entry(kind, row.effective_id, row.effective_version)


# --- restart kinds: what this process runs -----------------------------------------------------

_process_models: dict[str, CatalogEntry | None] = {}
_process_lock = threading.Lock()


def process_model(kind: str) -> CatalogEntry | None:
    """The ASR, VAD or wake-word model this process runs, fixed at its first use.

    A model already fixed in this process is returned as it is, whatever was switched
    since: that is what "takes effect after a restart" means. Otherwise the selected model
    is fixed now; it becomes effective once it has loaded (``confirm_loaded``).
    """
    if kind not in RESTART_KINDS:
        raise YimiError("unknown_model", f"{kind} models are not fixed per process")
    with _process_lock:
        if kind in _process_models:
            return _process_models[kind]
    row = selection(kind)
    entry = _entry(kind, row.selected_id, row.selected_version)
    with _process_lock:
        return _process_models.setdefault(kind, entry)


def confirm_loaded(kind: str, entry: CatalogEntry) -> bool:
    """A process loaded its restart-kind model: mark it effective.

    Steps: 1. nothing to do if it already is; 2. conditional UPDATE where ``selected`` is
    still this model and ``effective`` is still what we read: the old effective model
    becomes ``previous``. Losing the race (a newer switch) changes nothing.
    """
    row = selection(kind)
    if row.effective_key == entry.key:
        if row.error_code and row.selected_key == entry.key:
            ModelSelection.objects.filter(id=row.id, selected_id=entry.id, selected_version=entry.version).update(error_code="", error_message="")
        return False
    changed = ModelSelection.objects.filter(
        id=row.id, selected_id=entry.id, selected_version=entry.version, effective_id=row.effective_id,
        effective_version=row.effective_version,
    ).update(
        previous_id=row.effective_id, previous_version=row.effective_version, effective_id=entry.id,
        effective_version=entry.version, state=State.EFFECTIVE, error_code="", error_message="",
    )
    if changed:
        log_event("model_effective", kind=kind, model=entry.key, after="restart")
    return bool(changed)


def forget_process_models() -> None:
    """Forget which restart-kind models this process fixed (a fresh process starts so)."""
    with _process_lock:
        _process_models.clear()


def note_error(kind: str, exc: YimiError) -> None:
    """Show a failure to use the kind's model on the settings page (the effective model,
    if any, is unchanged)."""
    ModelSelection.objects.filter(kind=kind).update(error_code=exc.code[:48], error_message=exc.message[:500])


# --- the signed switch -------------------------------------------------------------------------


@dataclass(frozen=True)
class SignedSwitch:
    device_id: str
    kind: str
    model_id: str
    version: str
    issued_at: int
    nonce: str
    signature: str

    @classmethod
    def from_payload(cls, data: Any) -> SignedSwitch:
        if not isinstance(data, dict):
            raise YimiError("invalid_request", "a model switch is a JSON object")
        names = ("device_id", "kind", "model_id", "version", "nonce", "signature")
        missing = [n for n in names if not isinstance(data.get(n), str) or not data[n]]
        issued = data.get("issued_at")
        if isinstance(issued, str) and issued.isdigit():
            issued = int(issued)
        if isinstance(issued, bool) or not isinstance(issued, int):
            missing.append("issued_at")
        if missing or not isinstance(issued, int):
            raise YimiError("invalid_request", f"missing or invalid fields: {', '.join(missing)}")
        return cls(**{n: data[n] for n in names}, issued_at=issued)


def switch_model(switch: SignedSwitch, *, now: datetime | None = None) -> ModelSelection:
    """Switch a kind to another catalog model, on the strength of a device signature.

    Steps: 1. the signer is an active, non-guest device of the owner; 2. ``issued_at`` is
    within 5 minutes of the server clock and the nonce is well-formed; 3. the kind and
    model are in the catalog (face models are listed only); 4. the device's signature
    over ``model_switch_message`` (which names the files' digests) verifies; 5. the new
    model's files match their digests and its metadata is valid — a broken model is
    refused before anything changes; 6. in one transaction: record the switch (the nonce
    is single use) and update the selection under a row lock, per kind (module
    docstring). An embedding rebuild is dispatched after commit. Any refusal changes nothing.
    """
    now = now or timezone.now()
    device = switch_signers().active(switch.device_id)
    if device is None:
        raise YimiError("forbidden", "the switch must be signed by one of the owner's active devices")
    if not is_owner_device(device):
        raise YimiError("forbidden", "only one of the owner's own (non-guest) devices can switch models")
    if abs(now.timestamp() - switch.issued_at) > SWITCH_MAX_SKEW_SECONDS:
        raise YimiError("switch_expired", "the signed switch is older than 5 minutes (or from the future)")
    if not NONCE.match(switch.nonce):
        raise YimiError("invalid_request", "nonce: 16-64 characters of letters, digits, '_' or '-'")
    if switch.kind not in catalog.KINDS:
        raise YimiError("unknown_model", f"unknown model kind {switch.kind!r}")
    if switch.kind == "face":
        raise YimiError("face_switch_via_enrollment", "face models are listed only; switch them through face enrollment")
    entry = catalog.load_catalog().find(switch.kind, switch.model_id, switch.version)
    if entry is None:
        raise YimiError("unknown_model", f"there is no {switch.kind} model {switch.model_id}@{switch.version} in the catalog")
    message = model_switch_message(
        device.id, switch.kind, switch.model_id, switch.version, entry.digest_summary, switch.issued_at, switch.nonce
    )
    if not device.verify(message, switch.signature):
        raise YimiError("bad_signature", "the signature over the model switch does not match the device key")
    catalog.check_entry(entry)
    selection(switch.kind)  # make sure the row exists before locking it
    try:
        with transaction.atomic():
            ModelSwitch.objects.create(
                kind=switch.kind, model_id=switch.model_id, version=switch.version, device_id=device.id,
                issued_at=datetime.fromtimestamp(switch.issued_at, tz=UTC), nonce=switch.nonce,
                message=message.decode(), signature=switch.signature,
            )
            row = ModelSelection.objects.select_for_update().get(kind=switch.kind)
            _apply_switch(row, entry, device.owner_id)
    except IntegrityError:
        raise YimiError("switch_replayed", "this signed switch was already used") from None
    log_event("model_switched", kind=switch.kind, model=entry.key, state=row.state, device_id=device.id)
    if row.state == State.REBUILDING:
        _dispatch_rebuild_after_commit(entry.id, entry.version)
    return row


def _apply_switch(row: ModelSelection, entry: CatalogEntry, owner_id: int) -> None:
    row.selected_id, row.selected_version = entry.id, entry.version
    row.error_code, row.error_message = "", ""
    row.progress_done = row.progress_total = 0
    if row.effective_key == entry.key:
        row.state = State.EFFECTIVE
    elif entry.kind in RESTART_KINDS:
        row.state = State.PENDING_RESTART
    elif entry.kind == "embedding":
        row.state = State.REBUILDING
    else:  # voiceprint
        row.state = State.NEEDS_ENROLLMENT
    row.save()
    if row.state == State.NEEDS_ENROLLMENT:
        _settle_voiceprint(row, owner_id)


# --- voiceprint: effective once the channels in use are enrolled again -------------------------


def settle_voiceprint_switch(owner_id: int) -> ModelSelection:
    """Re-count the channels enrolled under the selected voiceprint model; make it
    effective when every channel in use under the effective model has one."""
    selection("voiceprint")
    with transaction.atomic():
        row = ModelSelection.objects.select_for_update().get(kind="voiceprint")
        if row.state == State.NEEDS_ENROLLMENT:
            _settle_voiceprint(row, owner_id)
    return row


def _settle_voiceprint(row: ModelSelection, owner_id: int) -> None:
    """Steps: 1. channels in use = channels enrolled under the effective model; 2. done =
    those enrolled under the selected model as well; 3. progress done/total; 4. all done
    (or none in use) → selected becomes effective, the old one previous. Caller holds the
    row lock."""
    in_use = set(enrolled_channels(owner_id, row.effective_key)) if row.effective_key else set()
    done = in_use & set(enrolled_channels(owner_id, row.selected_key))
    row.progress_total, row.progress_done = len(in_use), len(done)
    if done == in_use:
        row.previous_id, row.previous_version = row.effective_id, row.effective_version
        row.effective_id, row.effective_version = row.selected_id, row.selected_version
        row.state = State.EFFECTIVE
        log_event("model_effective", kind="voiceprint", model=row.effective_key, after="reenrollment")
    row.save()


# --- embedding: effective once the derived index is rebuilt --------------------------------------


REBUILD_VECTOR_INDEX = "devices.rebuild_vector_index"  # llm.tasks registers the task (LlmConfig.ready imports it)


def _dispatch_rebuild_after_commit(model_id: str, version: str) -> None:
    transaction.on_commit(lambda: _dispatch_rebuild(model_id, version))


def _dispatch_rebuild(model_id: str, version: str) -> None:
    """The rebuild, by its task name: on a Celery worker when a broker is configured;
    inline in the embedded default (``apply``: an exception is kept in its result)."""
    task = celery_app.tasks[REBUILD_VECTOR_INDEX]
    if settings.CELERY_BROKER_URL:
        task.delay(model_id, version)
    else:
        task.apply(args=(model_id, version))


def rebuild_progress(model_id: str, version: str, done: int, total: int) -> bool:
    """Record progress; False when this rebuild is no longer wanted (another switch)."""
    return bool(
        ModelSelection.objects.filter(
            kind="embedding", selected_id=model_id, selected_version=version, state=State.REBUILDING
        ).update(progress_done=done, progress_total=total)
    )


def finish_rebuild(model_id: str, version: str) -> bool:
    """Compare-and-set: the rebuilt model becomes effective only if it is still the one
    selected and rebuilding; returns False when the race was lost (the index is stale)."""
    with transaction.atomic():
        row = ModelSelection.objects.select_for_update().get(kind="embedding")
        if (row.selected_id, row.selected_version, row.state) != (model_id, version, State.REBUILDING):
            return False
        if row.effective_key != row.selected_key:
            row.previous_id, row.previous_version = row.effective_id, row.effective_version
        row.effective_id, row.effective_version = model_id, version
        row.state, row.progress_done = State.EFFECTIVE, row.progress_total
        row.error_code = row.error_message = ""
        row.save()
    log_event("model_effective", kind="embedding", model=f"{model_id}@{version}", after="index_rebuild")
    return True


def fail_rebuild(model_id: str, version: str, exc: YimiError) -> None:
    """The rebuild failed: show why; the effective model stays as it was."""
    ModelSelection.objects.filter(
        kind="embedding", selected_id=model_id, selected_version=version, state=State.REBUILDING
    ).update(state=State.FAILED, error_code=exc.code[:48], error_message=exc.message[:500])
    log_event("index_rebuild_failed", model=f"{model_id}@{version}", error_code=exc.code)


# --- the settings page ---------------------------------------------------------------------------

STATE_NOTES = {
    State.PENDING_RESTART: "takes effect after the service is restarted",
    State.NEEDS_ENROLLMENT: "takes effect when every capture channel in use has been enrolled again with it",
    State.REBUILDING: "takes effect when the vector index has been rebuilt",
    State.LISTED: "listed only: face models are switched through face enrollment",
    State.FAILED: "the effective model is unchanged",
    State.NONE: "no model of this kind in the catalog",
}


def settings_overview() -> list[dict[str, Any]]:
    """One row per kind for the settings page."""
    cat = catalog.load_catalog()
    rows = []
    for kind in catalog.KINDS:
        sel = selection(kind)
        rows.append(
            {
                "kind": kind,
                "selected": sel.selected_key,
                "effective": sel.effective_key,
                "previous": sel.previous_key,
                "state": sel.state,
                "note": STATE_NOTES.get(State(sel.state), ""),
                "progress": f"{sel.progress_done}/{sel.progress_total}" if sel.progress_total or sel.state == State.REBUILDING else "",
                "error": f"{sel.error_code}: {sel.error_message}" if sel.error_code else "",
                "entries": [
                    {"key": e.key, "id": e.id, "version": e.version, "digest_summary": e.digest_summary, "default": e.default}
                    for e in cat.of_kind(kind)
                ],
            }
        )
    return rows
