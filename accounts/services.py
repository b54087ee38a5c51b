"""Identity and admission: the owner account and the scope of every inbound utterance."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.db import transaction

from accounts.models import AdmissionRecord, Scope, User


@dataclass(frozen=True)
class OwnerCreated:
    user: User
    password: str | None  # the generated password, shown once; None when read from a file


def get_owner() -> User | None:
    return User.objects.filter(is_owner=True).first()


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


def admit_text(device) -> AdmissionRecord:  # type: ignore[no-untyped-def]
    """Admission, first version: text from a paired owner device runs in scope ``owner``;
    a device marked as guest runs in scope ``guest``. (Voice identity sets
    ``owner_uncertain`` once voiceprints land.)"""
    scope, reason = (Scope.GUEST, "guest_device") if device.is_guest else (Scope.OWNER, "paired_owner_device")
    return AdmissionRecord.objects.create(
        owner_id=device.owner_id, device=device, channel=AdmissionRecord.Channel.TEXT, scope=scope, reason=reason
    )


def admit_voice(device, *, scope: str, reason: str) -> AdmissionRecord:  # type: ignore[no-untyped-def]
    """Admission for a spoken request: the scope was decided from the voice itself
    (``accounts.voice.decide_speaker``: voiceprint, trust window or call anchor), not
    from the device. A guest device can never be admitted above ``guest``."""
    if scope not in (Scope.OWNER, Scope.OWNER_UNCERTAIN, Scope.GUEST):
        raise ValueError(f"a voice admission cannot have scope {scope!r}")
    if device.is_guest:
        scope, reason = Scope.GUEST, "guest_device"
    return AdmissionRecord.objects.create(
        owner_id=device.owner_id, device=device, channel=AdmissionRecord.Channel.VOICE, scope=scope, reason=reason[:64]
    )
