"""Device identity: pairing, authentication and revocation.

The only code that writes ``Device``, ``PairingCode``, ``PairingGuessSlot`` and
``SignedRequestNonce``. A device is an identity of its owner's account (its Ed25519 key,
checked by ``accounts.signatures``); the websocket and HTTP doors in ``devices/`` call in
here to pair, authenticate (``active_device`` on every frame) and revoke.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from accounts import signatures
from accounts.models import Device, PairingCode, PairingGuessSlot, SignedRequestNonce, User
from accounts.queries import active_device_sql
from accounts.services import is_owner
from yimi_project import push
from yimi_project.errors import YimiError
from yimi_project.ids import uuid_or_nil
from yimi_project.infra import statements
from yimi_project.logs import log_event

# Crockford's base32 without I, L, O, U: easy to read aloud and to type.
CODE_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
CODE_LENGTH = 8
CHANNEL_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
MAX_CAPTURE_CHANNELS = 8


def _digest(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


def normalize_code(code: str) -> str:
    return re.sub(r"[\s-]", "", code).upper()


def format_code(code: str) -> str:
    return f"{code[:4]}-{code[4:]}"


# --- pairing codes ----------------------------------------------------------------------


def issue_pairing_code(owner, *, for_guest: bool = False, now: datetime | None = None) -> tuple[PairingCode, str]:  # type: ignore[no-untyped-def]
    """Create a single-use pairing code valid for 10 minutes from ``now``. Returns the
    stored row (which keeps only a digest) and the code itself, formatted, to show once.

    Only the owner pairs devices: a code (for an owner device or a guest device) is issued
    only for the owner's own account (``accounts.services.is_owner``); for anyone else —
    a second superuser included — it raises ``forbidden`` and nothing is stored."""
    if not is_owner(owner):
        raise YimiError("forbidden", "only the owner can issue pairing codes")
    code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
    pairing = PairingCode.objects.create(
        owner=owner,
        digest=_digest(code),
        for_guest=for_guest,
        expires_at=(now or timezone.now()) + timedelta(seconds=settings.PAIRING_CODE_TTL_SECONDS),
    )
    return pairing, format_code(code)


# --- counting guesses at pairing codes ---------------------------------------------------
# Each scope (one client address, or everyone) has as many slots as it may have failed
# guesses per window. A guess takes a slot before the code is looked at; a wrong, used or
# expired code keeps it for the window, any other outcome gives it back. Taking is a
# compare-and-set UPDATE, so concurrent guesses cannot take more slots than there are.

GUESS_SCOPE_EVERYONE = "everyone"


@dataclass(frozen=True)
class GuessSlot:
    slot_id: int
    previous: datetime
    taken_at: datetime


def _address_scope(client_ip: str) -> str:
    return f"address:{client_ip}"[:80]


def _take_guess_slot(scope: str, limit: int, now: datetime) -> GuessSlot | None:
    """Take one free guess slot of ``scope``; ``None`` when all ``limit`` are taken.

    Steps: 1. make sure the scope's ``limit`` slots exist (INSERT … ON CONFLICT DO
    NOTHING; a new slot is free, as if taken just before the window began); 2. read the
    free ones (taken before the window began), oldest first; 3. take one with
    ``UPDATE … SET taken_at = now WHERE id = ? AND taken_at = <as read>``: a row count of
    0 means a concurrent guess took it first, so try the next one; 4. if every free slot
    was lost to others, read again (at most three rounds). A slot is free again
    ``PAIRING_FAILURE_WINDOW_SECONDS`` after it was taken, so at most ``limit`` guesses
    count in any window of that length.
    """
    since = now - timedelta(seconds=settings.PAIRING_FAILURE_WINDOW_SECONDS)
    slots = PairingGuessSlot.objects.filter(scope=scope, number__lt=limit)
    for _ in range(3):
        if slots.count() < limit:
            PairingGuessSlot.objects.bulk_create(
                [PairingGuessSlot(scope=scope, number=n, taken_at=since - timedelta(seconds=1)) for n in range(limit)],
                ignore_conflicts=True,
            )
        free = list(slots.filter(taken_at__lt=since).order_by("taken_at", "number").values_list("id", "taken_at"))
        if not free:
            return None
        for slot_id, taken_at in free:
            if PairingGuessSlot.objects.filter(id=slot_id, taken_at=taken_at).update(taken_at=now) == 1:
                return GuessSlot(slot_id=slot_id, previous=taken_at, taken_at=now)
    return None


def _give_back(slot: GuessSlot) -> None:
    """The guess did not count: the slot is as free as it was (unless its window passed)."""
    PairingGuessSlot.objects.filter(id=slot.slot_id, taken_at=slot.taken_at).update(taken_at=slot.previous)


def _take_guess(client_ip: str, now: datetime) -> list[GuessSlot]:
    """One slot of everyone's and one of this address's, or ``rate_limited`` (and none)."""
    everyone = _take_guess_slot(GUESS_SCOPE_EVERYONE, settings.PAIRING_FAILURES_GLOBAL, now)
    if everyone is None:
        raise YimiError("rate_limited", "too many wrong pairing codes; pairing is paused for a few minutes")
    address = _take_guess_slot(_address_scope(client_ip), settings.PAIRING_FAILURES_PER_IP, now)
    if address is None:
        _give_back(everyone)
        raise YimiError("rate_limited", "too many wrong pairing codes from this address; wait 10 minutes")
    # Other addresses' slots that have been free for a whole window are as good as absent
    # (a new slot is free for less than that, so this never deletes one about to be taken).
    window = timedelta(seconds=settings.PAIRING_FAILURE_WINDOW_SECONDS)
    PairingGuessSlot.objects.filter(scope__startswith="address:", taken_at__lt=now - 2 * window).exclude(
        scope=_address_scope(client_ip)
    ).delete()
    return [everyone, address]


@dataclass(frozen=True)
class PairingRequest:
    code: str
    kind: str
    name: str
    capture_channels: list[str]
    public_key: str
    signature: str
    relay_via: str | None = None

    @classmethod
    def from_payload(cls, data: Any) -> PairingRequest:
        if not isinstance(data, dict):
            raise YimiError("invalid_request", "expected a JSON object")
        missing = [f for f in ("code", "kind", "name", "public_key", "signature") if not isinstance(data.get(f), str)]
        if missing:
            raise YimiError("invalid_request", f"missing or non-string fields: {', '.join(missing)}")
        channels = data.get("capture_channels", [])
        if not isinstance(channels, list) or not all(isinstance(c, str) for c in channels):
            raise YimiError("invalid_request", "capture_channels must be a list of strings")
        relay = data.get("relay_via")
        if relay is not None and not isinstance(relay, str):
            raise YimiError("invalid_request", "relay_via must be a device id")
        return cls(
            code=data["code"],
            kind=data["kind"],
            name=data["name"].strip(),
            capture_channels=channels,
            public_key=data["public_key"],
            signature=data["signature"],
            relay_via=relay,
        )

    def validate(self) -> None:
        if self.kind not in Device.Kind.values:
            raise YimiError("invalid_request", f"kind must be one of {', '.join(Device.Kind.values)}")
        if not 1 <= len(self.name) <= 64:
            raise YimiError("invalid_request", "name must be 1 to 64 characters")
        if len(self.capture_channels) > MAX_CAPTURE_CHANNELS or not all(
            CHANNEL_NAME.match(c) for c in self.capture_channels
        ):
            raise YimiError("invalid_request", "capture_channels: at most 8 names like phone_app, glasses, mac")
        if self.kind == Device.Kind.WATCH and not self.relay_via:
            raise YimiError("invalid_request", "a watch must name the phone it relays through (relay_via)")
        if self.kind != Device.Kind.WATCH and self.relay_via:
            raise YimiError("invalid_request", "only a watch relays through a phone")
        signatures.decode_public_key(self.public_key)


def pair_device(request: PairingRequest, *, client_ip: str, now: datetime | None = None) -> Device:
    """Pair a device with a single-use code.

    Steps: 1. validate the request and the signature over (code, public key), proving the
    device holds the key (bad input is no guess and changes nothing); 2. take a guess
    slot of everyone's and of this address's (``_take_guess``, compare-and-set), or
    refuse with ``rate_limited``; 3. find the code by digest and claim it with a
    conditional UPDATE (``used_at IS NULL``): losing that race means someone else used
    it; 4. create the device in the same transaction; 5. an unknown, used or expired code
    is a failed guess and keeps its slots for the window; any other outcome (success
    included) gives them back.
    """
    now = now or timezone.now()
    request.validate()
    code = normalize_code(request.code)
    if not signatures.verify(request.public_key, signatures.pairing_message(code, request.public_key), request.signature):
        raise YimiError("bad_signature", "the signature over the pairing code does not match the public key")
    slots = _take_guess(client_ip, now)
    counted = False
    try:
        return _claim_code_and_create(request, code, now)
    except YimiError as exc:
        if exc.code in ("invalid_code", "code_used", "code_expired"):
            counted = True
            log_event("pairing_failed", reason=exc.code, client_ip=client_ip)
        raise
    finally:
        if not counted:
            for slot in slots:
                _give_back(slot)


def unique_device_name(owner_id: int, name: str) -> str:
    """``name``, or when one of the owner's devices (not revoked) already has it, the first
    free "name 2", "name 3", ... so two devices are never told apart by id alone."""
    taken = set(Device.objects.filter(owner_id=owner_id, revoked_at=None).values_list("name", flat=True))
    if name not in taken:
        return name
    n = 2
    while (candidate := f"{name[:58]} {n}") in taken:
        n += 1
    return candidate


@transaction.atomic
def _claim_code_and_create(request: PairingRequest, code: str, now: datetime) -> Device:
    pairing = PairingCode.objects.filter(digest=_digest(code)).first()
    if pairing is None:
        raise YimiError("invalid_code", "this pairing code is not valid")
    if pairing.used_at is not None:
        raise YimiError("code_used", "this pairing code was already used")
    if pairing.expires_at <= now:
        raise YimiError("code_expired", "this pairing code has expired; ask for a new one")
    relay = None
    if request.relay_via:
        relay = Device.objects.filter(
            id=uuid_or_nil(request.relay_via), owner_id=pairing.owner_id, kind=Device.Kind.PHONE, revoked_at=None
        ).first()
        if relay is None:
            raise YimiError("invalid_request", "relay_via must be one of the owner's paired phones")
    claimed = PairingCode.objects.filter(id=pairing.id, used_at=None).update(used_at=now)
    if claimed != 1:
        raise YimiError("code_used", "this pairing code was already used")
    try:
        with transaction.atomic():
            device = Device.objects.create(
                owner_id=pairing.owner_id,
                name=unique_device_name(pairing.owner_id, request.name),
                kind=request.kind,
                capture_channels=request.capture_channels,
                public_key=request.public_key,
                relay_via=relay,
                is_guest=pairing.for_guest,
            )
    except IntegrityError:
        raise YimiError("invalid_public_key", "a device with this public key is already paired") from None
    PairingCode.objects.filter(id=pairing.id).update(used_by=device)
    log_event("device_paired", device_id=str(device.id), kind=device.kind, guest=device.is_guest)
    return device



# --- authentication and revocation ------------------------------------------------------


def active_device(device_id: Any) -> Device:
    """The device, if it exists and is not revoked; raises otherwise. Its owner's account
    comes in the same query (``accounts.services.is_owner_device`` reads it from there:
    admission needs no second round trip). On every frame of every socket, so on PostgreSQL
    its SQL is built once (``accounts.queries.active_device_sql``), not by the ORM each time;
    SQLite takes the ORM (``select_related``)."""
    if not statements.on_postgresql():
        device = Device.objects.select_related("owner").filter(id=uuid_or_nil(device_id)).first()
        if device is None:
            raise YimiError("not_authenticated", "unknown device")
        return _active(device)
    sql, fields = active_device_sql()
    key = Device._meta.get_field("id").get_db_prep_value(uuid_or_nil(device_id), connection)
    return device_of(statements.fetch(sql, [key], fields), fields)


def device_of(rows: list[list[Any]], fields: tuple[Any, ...]) -> Device:
    """The device (its owner's account cached on it) from the first row of a statement that
    starts with ``accounts.queries.active_device_sql``'s columns; raises as ``active_device`` does."""
    if not rows:
        raise YimiError("not_authenticated", "unknown device")
    n, m = len(Device._meta.concrete_fields), len(Device._meta.concrete_fields) + len(User._meta.concrete_fields)
    device = statements.instance(Device, fields[:n], rows[0][:n])
    Device._meta.get_field("owner").set_cached_value(device, statements.instance(User, fields[n:m], rows[0][n:m]))  # type: ignore[union-attr]
    return _active(device)


def _active(device: Device) -> Device:
    if device.revoked_at is not None:
        raise YimiError("device_revoked", "this device was revoked by its owner")
    return device


def accept_request_nonce(device: Device, nonce: str, timestamp: int, *, now: datetime | None = None) -> None:
    """Accept the nonce of a signed HTTP request once; raise ``request_replayed`` if this
    device used it before.

    Steps: 1. forget nonces whose requests can no longer pass the timestamp check
    (``expires_at`` in the past); 2. INSERT (device, nonce, expires_at = timestamp + the
    allowed skew): the unique constraint makes a second use fail in any process, and that
    request is refused. A nonce is kept exactly as long as a replay could otherwise pass.
    """
    now = now or timezone.now()
    SignedRequestNonce.objects.filter(expires_at__lt=now).delete()
    expires_at = datetime.fromtimestamp(timestamp + settings.HTTP_SIGNATURE_MAX_SKEW_SECONDS, tz=UTC)
    try:
        with transaction.atomic():
            SignedRequestNonce.objects.create(device=device, nonce=nonce, expires_at=expires_at)
    except IntegrityError:
        raise YimiError(
            "request_replayed", "this request's X-Yimi-Nonce was already used; sign every request with a fresh nonce"
        ) from None


def authenticate_challenge(device_id: Any, nonce: str, signature: Any) -> Device:
    """Check a websocket auth frame: the device signed our nonce with its key."""
    device = active_device(device_id)
    if not signatures.verify(device.public_key, signatures.auth_message(nonce, str(device.id)), signature):
        raise YimiError("bad_signature", "the signature over the challenge does not match this device's key")
    Device.objects.filter(id=device.id).update(last_seen_at=timezone.now())
    return device


def revoke_device(device: Device) -> bool:
    """Revoke a device and close its open connections at once.

    Steps: 1. conditional UPDATE ``revoked_at IS NULL`` → now (a second revoke is a
    no-op and returns False); 2. after commit, tell every consumer of this device to
    close with code 4403. Consumers also re-check ``revoked_at`` on every frame, so a
    lost group message still cannot keep a revoked device talking.
    """
    with transaction.atomic():
        changed = Device.objects.filter(id=device.id, revoked_at=None).update(revoked_at=timezone.now())
        if changed:
            transaction.on_commit(lambda: push.to_device_sync(device.id, {"type": "device.revoked"}))
    if changed:
        log_event("device_revoked", device_id=str(device.id))
    return bool(changed)


def owner_devices_preferring(owner_id: int, kinds: tuple[str, ...]) -> list[Any]:
    """Ids of the owner's active, non-guest devices of ``kinds``; all of them if none is of
    those kinds (so a card is never addressed to nobody). Registered as the push seam's
    device chooser (``yimi_project.push.owner_devices``, ``AccountsConfig.ready``)."""
    devices = list(Device.objects.filter(owner_id=owner_id, revoked_at__isnull=True, is_guest=False).only("id", "kind"))
    preferred = [d.id for d in devices if d.kind in kinds]
    return preferred or [d.id for d in devices]
