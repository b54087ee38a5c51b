"""The Mac relay's records (devices/mac/relay.py; docs/protocol.md, "The Mac relay").

Written only by ``devices.mac.relay``. Nothing here holds an operation's or a result's
content: the relay carries those sealed to the Mac's key, and the command log keeps only
what the owner reads to know what Yimi did on the Mac (see ``MacOperation``).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class MacKey(models.Model):
    """The X25519 public key an owner's Mac registered with a signed ``mac.hello``."""

    device = models.OneToOneField("accounts.Device", on_delete=models.CASCADE, primary_key=True, related_name="mac_key")
    x25519_public_key = models.CharField(max_length=64, help_text="raw X25519 public key, base64")
    registered_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.device_id}: {self.x25519_public_key[:12]}…"


class MacPause(models.Model):
    """Whether the owner paused Yimi's Mac operations, and from which device."""

    owner = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="mac_pause")
    paused = models.BooleanField(default=False)
    changed_at = models.DateTimeField()
    changed_by = models.ForeignKey("accounts.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    def __str__(self) -> str:
        return "paused" if self.paused else "running"


class MacOperation(models.Model):
    """One operation Yimi asked of the owner's Mac: the command log.

    In plain text, for the owner to read: the operation's kind, its target (the path; the
    application and action; for a command its argv — the owner must be able to see what
    ran), the outcome and exit code, sizes and SHA-256 digests. Never stored: file
    contents (read or written), command output, screenshots — those exist only sealed on
    the wire and in the memory of the platform process that waited for the result.
    """

    class Outcome(models.TextChoices):
        SENT = "sent"  # sent to the Mac, no result yet
        OK = "ok"
        ERROR = "error"  # the Mac refused or failed (error_code says why)
        PAUSED = "paused"  # refused: the owner paused Mac operations
        OFFLINE = "mac_offline"  # no connected Mac took it
        TIMEOUT = "mac_timeout"  # taken, no result in time: the Mac may or may not have done it

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False, help_text="the op id on the wire")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="mac_operations")
    device = models.ForeignKey("accounts.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="mac_operations")
    call_id = models.CharField(max_length=80, blank=True, help_text="the capability call that asked for it")
    tool = models.CharField(max_length=100, blank=True)
    kind = models.CharField(max_length=32)
    target = models.CharField(max_length=1024, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    error_code = models.CharField(max_length=64, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    size_bytes = models.BigIntegerField(null=True, blank=True)
    sha256 = models.CharField(max_length=64, blank=True, help_text="digest of the content read or written, or of stdout")
    requested_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["owner", "requested_at"])]

    def __str__(self) -> str:
        return f"{self.kind} {self.target[:60]} ({self.outcome})"
