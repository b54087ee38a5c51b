from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.db import models

from accounts import signatures


class User(AbstractUser):
    """A person with a login. Exactly one user is the owner: the person Yimi belongs to.

    Staff users (who review capability packs) are ordinary staff accounts.
    """

    is_owner = models.BooleanField(default=False)
    time_zone = models.CharField(max_length=64, default="UTC")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["is_owner"], condition=models.Q(is_owner=True), name="one_owner_per_instance"
            )
        ]


class Scope(models.TextChoices):
    OWNER = "owner"
    OWNER_UNCERTAIN = "owner_uncertain"
    GUEST = "guest"
    BUILD = "build"
    CARE = "care"


class AdmissionRecord(models.Model):
    """Who is speaking, decided once per inbound utterance; runs bind to this record."""

    class Channel(models.TextChoices):
        TEXT = "text"
        VOICE = "voice"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(User, on_delete=models.CASCADE, related_name="admissions")
    device = models.ForeignKey("accounts.Device", on_delete=models.PROTECT, related_name="admissions")
    channel = models.CharField(max_length=8, choices=Channel.choices)
    scope = models.CharField(max_length=16, choices=Scope.choices)
    reason = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.scope} via {self.channel} ({self.reason})"


# --- voice identity (docs/voice.md) ------------------------------------------------------
#
# All of these are written only by ``accounts.voiceprint`` and ``accounts.voice``. A
# voiceprint model is named by its catalog key ``"{model id}@{version}"``: embeddings of
# different models are not comparable, so every enrollment, sample and threshold belongs
# to one model key.


class VoiceprintEnrollment(models.Model):
    """The owner's voiceprint for one capture channel under one voiceprint model: the
    centroid of the enrolled segments (and of learned samples, once there are any),
    weighted by voiced duration × quality."""

    owner = models.ForeignKey(User, on_delete=models.CASCADE, related_name="voiceprints")
    channel = models.CharField(max_length=32)
    model_key = models.CharField(max_length=160)
    centroid = models.JSONField(help_text="unit vector")
    dim = models.PositiveIntegerField()
    segment_count = models.PositiveSmallIntegerField()
    voiced_ms_total = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "channel", "model_key"], name="one_voiceprint_per_channel_and_model")
        ]

    def __str__(self) -> str:
        return f"voiceprint {self.channel} ({self.model_key}, {self.segment_count} segments)"


class VoiceprintSample(models.Model):
    """One embedding behind a channel's voiceprint: an enrolled segment, or a learning
    sample taken inside a trust window (at most 20 per channel; the first is the anchor)."""

    class Source(models.TextChoices):
        ENROLLED = "enrolled"
        LEARNED = "learned"

    owner = models.ForeignKey(User, on_delete=models.CASCADE, related_name="voiceprint_samples")
    channel = models.CharField(max_length=32)
    model_key = models.CharField(max_length=160)
    source = models.CharField(max_length=16, choices=Source.choices)
    embedding = models.JSONField(help_text="unit vector")
    voiced_ms = models.PositiveIntegerField()
    quality = models.FloatField()
    is_anchor = models.BooleanField(default=False, help_text="the first learning sample of the channel")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["owner", "channel", "model_key", "source"])]


class ChannelThreshold(models.Model):
    """The persistent verification threshold of one capture channel (per voiceprint model).

    Only ever rises (conditional UPDATE ``value < new``), never below 0.65; a restart or a
    lower configured value never lowers it. This row is also the lock that serializes
    writes to the channel's learning samples.
    """

    owner = models.ForeignKey(User, on_delete=models.CASCADE, related_name="voice_thresholds")
    channel = models.CharField(max_length=32)
    model_key = models.CharField(max_length=160)
    value = models.FloatField()
    reason = models.CharField(max_length=32, default="floor")
    raised_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "channel", "model_key"], name="one_threshold_per_channel_and_model")
        ]


class VoiceCall(models.Model):
    """A phone or app call carried by a voice session, from call start to hang-up."""

    owner = models.ForeignKey(User, on_delete=models.CASCADE, related_name="voice_calls")
    device = models.ForeignKey("accounts.Device", on_delete=models.CASCADE, related_name="voice_calls")
    call_id = models.CharField(max_length=64, help_text="the device's own id for the call")
    channel = models.CharField(max_length=32)
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["device", "call_id"], name="voice_call_id_unique_per_device")]

    def __str__(self) -> str:
        return f"call {self.call_id} ({'ended' if self.ended_at else 'open'})"


class TrustWindow(models.Model):
    """60 seconds opened by a biometric attestation (Face ID / Touch ID result signed by the
    device key). The first call whose speech starts inside it is bound to it until hang-up."""

    owner = models.ForeignKey(User, on_delete=models.CASCADE, related_name="trust_windows")
    device = models.ForeignKey("accounts.Device", on_delete=models.CASCADE, related_name="trust_windows")
    attestation_id = models.CharField(max_length=64, unique=True, help_text="single use: replay guard")
    method = models.CharField(max_length=16)
    signature = models.CharField(max_length=128)
    opened_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    bound_call = models.OneToOneField(
        VoiceCall, null=True, blank=True, on_delete=models.SET_NULL, related_name="trust_window"
    )
    bound_at = models.DateTimeField(null=True, blank=True)


class CallAnchor(models.Model):
    """The embedding of the first sentence of a call verified by voiceprint (never by the
    trust window). Recognizes short utterances for this call only; deleted at hang-up."""

    call = models.OneToOneField(VoiceCall, on_delete=models.CASCADE, related_name="anchor")
    embedding = models.JSONField(help_text="unit vector")
    model_key = models.CharField(max_length=160)
    score = models.FloatField(help_text="the voiceprint score that verified it")
    created_at = models.DateTimeField(auto_now_add=True)


# --- faces the owner enrolled (docs/faces.md) ------------------------------------------------
#
# Written only by ``accounts.faces``. Like voiceprints, every row belongs to one face model
# (its catalog key ``"{model id}@{version}"``): embeddings of two models are not comparable,
# so a person enrolled under another model must be enrolled again. No photo is kept: only
# each photo's SHA-256, the face's size and its embedding.


class FaceEnrollment(models.Model):
    """A person the owner enrolled from photos, under one face model: the centroid of the
    photos' face embeddings."""

    owner = models.ForeignKey(User, on_delete=models.CASCADE, related_name="face_enrollments")
    name = models.CharField(max_length=64, help_text="what Yimi calls this person, e.g. 王阿姨")
    model_key = models.CharField(max_length=160)
    centroid = models.JSONField(help_text="unit vector")
    dim = models.PositiveIntegerField()
    photo_count = models.PositiveSmallIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "name", "model_key"], name="one_face_enrollment_per_person_and_model")]
        ordering = ["name", "model_key"]

    def __str__(self) -> str:
        return f"{self.name} ({self.model_key}, {self.photo_count} photos)"


class FaceSample(models.Model):
    """One enrollment photo's face: its embedding, never the photo."""

    enrollment = models.ForeignKey(FaceEnrollment, on_delete=models.CASCADE, related_name="samples")
    embedding = models.JSONField(help_text="unit vector")
    face_px = models.PositiveIntegerField(help_text="the detected face's side, in pixels")
    photo_sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)


class FaceThreshold(models.Model):
    """The persistent recognition threshold of one enrolled person (per face model).

    Only ever rises (conditional UPDATE ``value < new``), never below the floor; a restart,
    a lower configured value, re-enrolling or forgetting the person never lowers it.
    """

    owner = models.ForeignKey(User, on_delete=models.CASCADE, related_name="face_thresholds")
    name = models.CharField(max_length=64)
    model_key = models.CharField(max_length=160)
    value = models.FloatField()
    reason = models.CharField(max_length=32, default="configured")
    raised_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "name", "model_key"], name="one_face_threshold_per_person_and_model")]


# --- device identity: paired devices, pairing codes, signed requests (accounts/devices.py) ---


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

    class Meta:
        db_table = "devices_device"

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    def verify_signature(self, message: bytes, signature: object) -> bool:
        """Whether ``signature`` (base64) was made by this device's key over ``message``.
        Voice identity, consent and payments check a device's signed statements through this."""
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

    class Meta:
        db_table = "devices_pairingcode"



class PairingGuessSlot(models.Model):
    """One of the guesses at pairing codes that a scope (one client address, or everyone)
    may have counted per window. A guess takes a free slot (``taken_at`` older than the
    window) with a compare-and-set UPDATE before the code is looked at, so concurrent
    guesses can never take more slots than there are (``services.pair_device``)."""

    scope = models.CharField(max_length=80, help_text="address:<client address>, or everyone")
    number = models.PositiveSmallIntegerField()
    taken_at = models.DateTimeField(db_index=True)

    class Meta:
        db_table = "devices_pairingguessslot"
        constraints = [models.UniqueConstraint(fields=["scope", "number"], name="one_pairing_guess_slot_per_number")]


class SignedRequestNonce(models.Model):
    """The nonce of a signed HTTP request, kept until the request's timestamp leaves the
    skew window: a second request with the same nonce from the same device is a replay."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="+")
    nonce = models.CharField(max_length=64)
    expires_at = models.DateTimeField(db_index=True, help_text="the request's timestamp + the allowed skew")

    class Meta:
        db_table = "devices_signedrequestnonce"
        constraints = [models.UniqueConstraint(fields=["device", "nonce"], name="one_use_per_request_nonce")]
