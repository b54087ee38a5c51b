"""Identity and admission: the owner account and the scope of every inbound utterance.

The owner is the one account marked ``is_owner`` (a constraint allows one); ``is_owner``
is the one answer to "may this account see or act on the owner's content", and staff or
superuser flags grant nothing. A device speaks for the owner only if it is not a guest
device and is paired to the owner's own account (``is_owner_device``); a device of any
other account is admitted as ``guest`` (``not_owner_device``). Every inbound utterance
stores an ``AdmissionRecord`` with its scope: typed text by ``text_admission``, speech by
``voice_admission`` from the voice identity decision (which can also give
``owner_uncertain``).

The only code that writes ``AdmissionRecord``, but on the hot text path: ``text_admission``
and ``voice_admission`` make the record and ``brain.services.accept_utterance`` (and
``accept_voice_utterance``) inserts it with the utterance's entry and run, in one statement
(docs/architecture.md, "One writer per table").
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from accounts.models import AdmissionRecord, Scope, User


@dataclass(frozen=True)
class OwnerCreated:
    user: User
    password: str | None  # the generated password, shown once; None when read from a file


def get_owner() -> User | None:
    return User.objects.filter(is_owner=True).first()


def is_owner(user: Any) -> bool:
    """Is ``user`` the owner — the one person this Yimi belongs to?

    The one answer to "may this account see or act on the owner's content": signed in,
    active, and the account marked ``is_owner`` (one per instance, by constraint). Staff
    and superuser flags grant nothing here: a second superuser is not the owner."""
    return bool(
        user is not None
        and getattr(user, "is_authenticated", False)
        and getattr(user, "is_active", False)
        and getattr(user, "is_owner", False)
    )


def is_owner_device(device: Any) -> bool:
    """Does ``device`` speak for the owner? Only a non-guest device paired to the owner's
    own account. A device of any other account (a second superuser's, say) never does."""
    if device.is_guest:
        return False
    meta = getattr(device, "_meta", None)  # a model row, or a plain signer (llm.model_settings.SwitchSigner)
    if meta is not None and meta.get_field("owner").is_cached(device):
        # Read with the device in the same query (accounts.devices.active_device, on every
        # frame): the account as of that read, without a second round trip.
        return bool(device.owner.is_owner and device.owner.is_active)
    return User.objects.filter(pk=device.owner_id, is_owner=True, is_active=True).exists()


def device_scope_limit(device: Any) -> tuple[str, str] | None:
    """``(guest, reason)`` when a device may not be admitted above ``guest`` — a guest
    device, or a device whose account is not the owner's; None for an owner device."""
    if device.is_guest:
        return Scope.GUEST, "guest_device"
    if not is_owner_device(device):
        return Scope.GUEST, "not_owner_device"
    return None


@transaction.atomic
def ensure_owner(username: str = "owner", password: str | None = None) -> OwnerCreated | None:
    """Create the owner account if there is none. Returns None when an owner exists."""
    if User.objects.select_for_update().filter(is_owner=True).exists():
        return None
    generated = password is None
    pw = password if password is not None else secrets.token_urlsafe(12)
    user = User.objects.create_superuser(username=username, email="", password=pw)
    user.is_owner = True
    user.save(update_fields=["is_owner"])
    return OwnerCreated(user=user, password=pw if generated else None)


def text_admission(device) -> AdmissionRecord:  # type: ignore[no-untyped-def]
    """Admission of typed text, not yet stored (an utterance stores it with its entry and
    run, ``brain.services.accept_utterance``): a paired owner device (``is_owner_device``:
    not a guest device, and paired to the owner's account) runs in scope ``owner``; a guest
    device, or a device of any other account, runs in scope ``guest``."""
    scope, reason = device_scope_limit(device) or (Scope.OWNER, "paired_owner_device")
    return AdmissionRecord(owner_id=device.owner_id, device=device, channel=AdmissionRecord.Channel.TEXT, scope=scope, reason=reason)


def admit_scheduled(device) -> AdmissionRecord:  # type: ignore[no-untyped-def]
    """Admission of a scheduled task's run (a schedule or a watch the owner stored): it acts
    with the scope of the device it is bound to, as typed text from that device would
    (``owner`` for a paired owner device, never above ``guest`` otherwise); the reason
    ``scheduled_task`` tells it apart."""
    scope, reason = device_scope_limit(device) or (Scope.OWNER, "scheduled_task")
    return AdmissionRecord.objects.create(
        owner_id=device.owner_id, device=device, channel=AdmissionRecord.Channel.TEXT, scope=scope, reason=reason
    )


def voice_admission(device, *, scope: str, reason: str) -> AdmissionRecord:  # type: ignore[no-untyped-def]
    """Admission for a spoken request, not yet stored: the scope was decided from the voice
    itself (``accounts.voice.decide_speaker``: voiceprint, trust window or call anchor), not
    from the device. A guest device, or a device not paired to the owner's account, can
    never be admitted above ``guest``."""
    if scope not in (Scope.OWNER, Scope.OWNER_UNCERTAIN, Scope.GUEST):
        raise ValueError(f"a voice admission cannot have scope {scope!r}")
    limit = device_scope_limit(device)
    if limit is not None:
        scope, reason = limit
    return AdmissionRecord(
        owner_id=device.owner_id, device=device, channel=AdmissionRecord.Channel.VOICE, scope=scope, reason=reason[:64]
    )
