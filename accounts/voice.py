"""Who is speaking: trust windows, calls, call anchors and the decision for one utterance.

The only code that writes ``TrustWindow``, ``VoiceCall`` and ``CallAnchor``. The rules
(docs/voice.md, "Trust windows, learning, call anchors"):

- A biometric attestation (Face ID / Touch ID result signed by the device key) opens a
  60-second trust window for that device. The first call whose speech starts inside it
  is bound to it until hang-up: that call's speech, other than Yimi's own echo, counts as
  the owner, for that call only. Speech inside the window can become learning samples.
- Once a sentence of a call is verified by voiceprint (not by the window), its embedding
  anchors the call; utterances the enrollment cannot settle, voiced ≥ 200 ms, count as
  the owner at cosine ≥ 0.65 with the anchor. Anchors are deleted at hang-up.
- Payment and barge-in modes never use the window; payment never accepts a call-only
  identity (window or anchor) either.
- Never "closest person wins": an unmatched voice is a guest, an uncertain one is
  ``owner_uncertain``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts import voiceprint
from accounts.models import CallAnchor, Scope, TrustWindow, VoiceCall
from accounts.services import device_scope_limit, is_owner_device
from yimi_project.errors import YimiError
from yimi_project.infra import statements
from yimi_project.logs import log_event

TRUST_WINDOW_SECONDS = 60
ATTESTATION_MAX_SKEW_SECONDS = 30
ATTESTATION_METHODS = ("face_id", "touch_id")
ANCHOR_MIN_VOICED_MS = 200
ANCHOR_MIN_COSINE = 0.65
MODES = ("normal", "payment", "barge_in")
ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def trust_window_message(device_id: str, attestation_id: str, method: str, issued_at: int) -> bytes:
    """What the device signs after a successful Face ID / Touch ID check."""
    return f"yimi-trust-window-v1\n{device_id}\n{attestation_id}\n{method}\n{issued_at}".encode()


# --- trust windows -------------------------------------------------------------------------------


def open_trust_window(device: Any, *, attestation_id: Any, method: Any, issued_at: Any, signature: Any, now: datetime | None = None) -> TrustWindow:
    """Open a 60-second trust window on a biometric attestation.

    Steps: 1. only an owner device (``is_owner_device``: not a guest device, paired to
    the owner's account) can vouch for the owner;
    2. the attestation is well-formed, names Face ID or Touch ID, and was issued within
    30 s of the server clock; 3. the device's signature over ``trust_window_message``
    verifies; 4. the attestation id is single use (unique constraint): a replay opens nothing.
    """
    now = now or timezone.now()
    if not is_owner_device(device):
        raise YimiError("forbidden", "only one of the owner's own devices can open a trust window")
    if not isinstance(attestation_id, str) or not ID.match(attestation_id):
        raise YimiError("invalid_frame", "attestation_id: 1-64 characters of letters, digits, '_', '.', ':' or '-'")
    if method not in ATTESTATION_METHODS:
        raise YimiError("invalid_frame", "method must be face_id or touch_id")
    if isinstance(issued_at, bool) or not isinstance(issued_at, int):
        raise YimiError("invalid_frame", "issued_at must be unix seconds")
    if abs(now.timestamp() - issued_at) > ATTESTATION_MAX_SKEW_SECONDS:
        raise YimiError("attestation_expired", "the attestation is older than 30 seconds (or from the future)")
    if not device.verify_signature(trust_window_message(str(device.id), attestation_id, method, issued_at), signature):
        raise YimiError("bad_signature", "the attestation signature does not match this device's key")
    try:
        with transaction.atomic():
            window = TrustWindow.objects.create(
                owner_id=device.owner_id, device=device, attestation_id=attestation_id, method=method,
                signature=str(signature)[:128], opened_at=now, expires_at=now + timedelta(seconds=TRUST_WINDOW_SECONDS),
            )
    except IntegrityError:
        raise YimiError("attestation_replayed", "this attestation was already used") from None
    log_event("trust_window_opened", device_id=str(device.id), method=method)
    return window


def open_window_at(device: Any, at: datetime) -> TrustWindow | None:
    """The trust window of this device that is open at ``at``, if any."""
    return (
        TrustWindow.objects.filter(device=device, opened_at__lte=at, expires_at__gt=at).order_by("-opened_at").first()
    )


# --- calls ------------------------------------------------------------------------------------------


def start_call(device: Any, call_id: Any, channel: str) -> VoiceCall:
    """Open a call (idempotent for a call that is still open).

    One INSERT on the way to the call's first audio: in autocommit it is its own
    transaction; inside a caller's transaction a savepoint keeps that transaction usable
    when the unique (device, call_id) fires for a retried start."""
    if not isinstance(call_id, str) or not ID.match(call_id):
        raise YimiError("invalid_frame", "call_id: 1-64 characters of letters, digits, '_', '.', ':' or '-'")
    try:
        with transaction.atomic() if transaction.get_connection().in_atomic_block else nullcontext():
            call = VoiceCall(owner_id=device.owner_id, device=device, call_id=call_id, channel=channel)
            statements.insert(call)
            return call
    except IntegrityError:
        call = VoiceCall.objects.get(device=device, call_id=call_id)
        if call.ended_at is not None:
            raise YimiError("call_ended", "this call already hung up; use a new call_id") from None
        return call


def end_call(call: VoiceCall) -> bool:
    """Hang up: conditional UPDATE ``ended_at IS NULL`` → now, and delete the call's anchor
    in the same transaction. A second hang-up changes nothing and returns False."""
    with transaction.atomic():
        ended = VoiceCall.objects.filter(id=call.id, ended_at=None).update(ended_at=timezone.now())
        CallAnchor.objects.filter(call_id=call.id).delete()
    if ended:
        log_event("call_ended", call=call.call_id)
    return bool(ended)


def _bound_window(call: VoiceCall | None, device: Any, started_at: datetime) -> TrustWindow | None:
    """The trust window this call is bound to, binding it now if its speech starts inside
    an open window that has no call yet (conditional UPDATE ``bound_call IS NULL``)."""
    if call is None or not VoiceCall.objects.filter(id=call.id, ended_at=None).exists():
        return None  # a call that hung up is bound to nothing
    bound = TrustWindow.objects.filter(bound_call_id=call.id).first()
    if bound is not None:
        return bound
    window = TrustWindow.objects.filter(
        device=device, opened_at__lte=started_at, expires_at__gt=started_at, bound_call=None
    ).order_by("opened_at").first()
    if window is None:
        return None
    try:
        with transaction.atomic():
            claimed = TrustWindow.objects.filter(id=window.id, bound_call=None).update(bound_call=call, bound_at=timezone.now())
    except IntegrityError:  # the call was bound by another window meanwhile
        claimed = 0
    if not claimed:
        return TrustWindow.objects.filter(bound_call_id=call.id).first()
    log_event("call_bound_to_trust_window", call=call.call_id)
    window.bound_call = call
    return window


# --- the decision ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpeakerDecision:
    scope: str
    reason: str  # voiceprint_verified, trust_window_call, call_anchor, voiceprint_uncertain, voiceprint_unmatched, no_voiceprint, guest_device, not_owner_device
    band: str  # the voiceprint's own band ("" when there was nothing to compare)
    score: float | None
    model_key: str

    @property
    def is_owner(self) -> bool:
        return self.scope == Scope.OWNER


def decide_speaker(
    *,
    device: Any,
    embedding: Sequence[float] | np.ndarray | None,
    model_key: str,
    voiced_ms: int,
    started_at: datetime,
    call: VoiceCall | None = None,
    mode: str = "normal",
) -> SpeakerDecision:
    """Decide the scope of one utterance.

    Steps: 1. a guest device, or a device not paired to the owner's account, speaks as a
    guest; 2. the voiceprint match (s = max over
    channels; verified against each channel's own threshold); 3. verified → owner, and the
    first such sentence of a call becomes its anchor; 4. otherwise, in normal mode, a call
    whose speech started inside a trust window is bound to it → owner for this call;
    5. otherwise, outside payment mode, a call anchor at cosine ≥ 0.65 for an utterance
    voiced ≥ 200 ms → owner for this call; 6. otherwise the band decides: uncertain →
    ``owner_uncertain``, unmatched → ``guest``; nothing to compare (no model, no
    enrollment) is not knowing → ``owner_uncertain``.
    """
    if mode not in MODES:
        raise YimiError("invalid_frame", f"mode must be one of {', '.join(MODES)}")
    limit = device_scope_limit(device)
    if limit is not None:
        return SpeakerDecision(limit[0], limit[1], "", None, model_key)
    if call is not None and call.ended_at is not None:
        call = None
    result = (
        voiceprint.match(device.owner_id, model_key, embedding)
        if embedding is not None and model_key
        else voiceprint.VoiceprintMatch(band="", score=None, channel=None)
    )
    if result.verified:
        if call is not None and embedding is not None:
            _anchor_call(call, embedding, model_key, result.score or 0.0)
        return SpeakerDecision(Scope.OWNER, "voiceprint_verified", result.band, result.score, model_key)
    if mode == "normal" and _bound_window(call, device, started_at) is not None:
        return SpeakerDecision(Scope.OWNER, "trust_window_call", result.band, result.score, model_key)
    if mode != "payment" and call is not None and embedding is not None and voiced_ms >= ANCHOR_MIN_VOICED_MS:
        anchor = CallAnchor.objects.filter(call=call, model_key=model_key).first()
        if anchor is not None and voiceprint.cosine(embedding, anchor.embedding) >= ANCHOR_MIN_COSINE:
            return SpeakerDecision(Scope.OWNER, "call_anchor", result.band, result.score, model_key)
    if result.band == voiceprint.UNMATCHED:
        return SpeakerDecision(Scope.GUEST, "voiceprint_unmatched", result.band, result.score, model_key)
    if result.band == voiceprint.UNCERTAIN:
        return SpeakerDecision(Scope.OWNER_UNCERTAIN, "voiceprint_uncertain", result.band, result.score, model_key)
    return SpeakerDecision(Scope.OWNER_UNCERTAIN, "no_voiceprint", "", None, model_key)


def _anchor_call(call: VoiceCall, embedding: Sequence[float] | np.ndarray, model_key: str, score: float) -> None:
    """The first voiceprint-verified sentence anchors an open call (unique per call)."""
    if CallAnchor.objects.filter(call=call).exists():
        return
    try:
        with transaction.atomic():
            if VoiceCall.objects.filter(id=call.id, ended_at=None).exists():
                CallAnchor.objects.create(call=call, embedding=voiceprint.unit(embedding).tolist(), model_key=model_key, score=score)
    except IntegrityError:
        pass  # another sentence anchored it first


def learn_in_trust_window(
    *,
    device: Any,
    channel: str,
    embedding: Sequence[float] | np.ndarray,
    model_key: str,
    voiced_ms: int,
    quality: float,
    started_at: datetime,
    mode: str = "normal",
    echo: bool = False,
) -> voiceprint.LearningOutcome | None:
    """Offer speech to the channel's learning set if it lies inside an open trust window of
    this device (normal mode, not echo, owner device). None when no window applies."""
    if mode != "normal" or echo or not model_key or not is_owner_device(device):
        return None
    if open_window_at(device, started_at) is None:
        return None
    return voiceprint.add_learning_sample(
        device.owner_id, channel, model_key, embedding, voiced_ms=voiced_ms, quality=quality
    )
