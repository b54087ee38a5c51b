from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from devices import signatures


class Device(models.Model):
    """A paired device: its kind, its capture channels and its Ed25519 public key."""

    class Kind(models.TextChoices):
        PHONE = "phone"
        WATCH = "watch"
        MAC = "mac"
        GLASSES = "glasses"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="devices")
    name = models.CharField(max_length=64)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    capture_channels = models.JSONField(default=list, blank=True)
    public_key = models.CharField(max_length=64, unique=True, help_text="raw Ed25519 public key, base64")
    # A watch has no network of its own: it relays through one of the owner's phones.
    relay_via = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="relayed")
    is_guest = models.BooleanField(default=False, help_text="text from a guest device runs in scope guest")
    paired_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    def verify_signature(self, message: bytes, signature: object) -> bool:
        """Whether ``signature`` (base64) was made by this device's key over ``message``.
        The authorities below devices/ (voice identity, consent, payments) check a device's
        signed statements through this, without importing devices/."""
        return signatures.verify(self.public_key, message, signature)


class PairingCode(models.Model):
    """A single-use code the owner hands to a new device. Only its digest is stored."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="pairing_codes")
    digest = models.CharField(max_length=64, unique=True)
    for_guest = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    used_by = models.ForeignKey(Device, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")


class PairingGuessSlot(models.Model):
    """One of the guesses at pairing codes that a scope (one client address, or everyone)
    may have counted per window. A guess takes a free slot (``taken_at`` older than the
    window) with a compare-and-set UPDATE before the code is looked at, so concurrent
    guesses can never take more slots than there are (``services.pair_device``)."""

    scope = models.CharField(max_length=80, help_text="address:<client address>, or everyone")
    number = models.PositiveSmallIntegerField()
    taken_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "number"], name="one_pairing_guess_slot_per_number")]


class SignedRequestNonce(models.Model):
    """The nonce of a signed HTTP request, kept until the request's timestamp leaves the
    skew window: a second request with the same nonce from the same device is a replay."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="+")
    nonce = models.CharField(max_length=64)
    expires_at = models.DateTimeField(db_index=True, help_text="the request's timestamp + the allowed skew")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["device", "nonce"], name="one_use_per_request_nonce")]


class Delivery(models.Model):
    """A device's ACK that a timeline entry reached its person: ``rendered`` (text) or
    ``played`` (speech). Facts count as told only when such an ACK covers them."""

    class Status(models.TextChoices):
        RENDERED = "rendered"
        PLAYED = "played"

    entry = models.ForeignKey("memory.TimelineEntry", on_delete=models.CASCADE, related_name="deliveries")
    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(max_length=16, choices=Status.choices)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["entry", "device", "status"], name="one_delivery_ack_per_status")
        ]
        verbose_name_plural = "deliveries"


from devices.hud_models import DeviceState  # noqa: E402,F401  (registered with the devices app)
from devices.mac.models import MacKey, MacOperation, MacPause  # noqa: E402,F401  (registered with the devices app)
from devices.push_to_talk_models import PushToTalkHold  # noqa: E402,F401  (registered with the devices app)
