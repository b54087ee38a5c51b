from __future__ import annotations

import uuid

from django.contrib.auth.models import AbstractUser
from django.db import models


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
    device = models.ForeignKey("devices.Device", on_delete=models.PROTECT, related_name="admissions")
    channel = models.CharField(max_length=8, choices=Channel.choices)
    scope = models.CharField(max_length=16, choices=Scope.choices)
    reason = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.scope} via {self.channel} ({self.reason})"
