"""The owner's side of releases: rollback requests (flow F6) and protected-baseline cards
(flow F5). Registered with the releases app through ``releases.models``; written only by
``releases.requested`` and ``releases.baseline``."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class RollbackRequest(models.Model):
    """The owner said they do not want this version: queued, executed at the next idle moment.

    ``pending`` → ``executing`` → ``executed`` | ``refused`` | ``failed``, by conditional
    UPDATEs (``executing`` is the claim: one worker runs it). It is
    executed only while the running build is still ``from_build`` and is the one most
    recently switched in; otherwise it is refused with the reason (a second "change it
    back" must not switch back to the version just taken away).
    """

    class State(models.TextChoices):
        PENDING = "pending"
        EXECUTING = "executing"
        EXECUTED = "executed"
        REFUSED = "refused"
        FAILED = "failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="rollback_requests")
    reason = models.TextField(help_text="the owner's own words")
    from_build = models.CharField(max_length=100, blank=True, help_text="the build that was current when the owner asked")
    to_build = models.CharField(max_length=100, blank=True, help_text="the build it went back to")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING, db_index=True)
    state_reason = models.TextField(blank=True)
    requested_at = models.DateTimeField()
    claimed_at = models.DateTimeField(null=True, blank=True, help_text="when an executor took it")
    decided_at = models.DateTimeField(null=True, blank=True)
    notice = models.ForeignKey("memory.TimelineEntry", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["-requested_at"]

    def __str__(self) -> str:
        return f"rollback of {self.from_build[:24] or '-'} ({self.state})"


class BaselineCard(models.Model):
    """A candidate that touches the protected baseline asks the owner once (flow F5).

    ``pending`` → ``approved`` | ``refused``, by a conditional UPDATE; one card per release,
    ever (asked once: a refused candidate is not asked again, it ends ``refused``).
    """

    class State(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REFUSED = "refused"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="baseline_cards")
    release = models.OneToOneField("releases.Release", on_delete=models.CASCADE, related_name="baseline_card")
    areas = models.JSONField(default=list, help_text="the protected areas the diff touches")
    paths = models.JSONField(default=list, help_text="the touched protected paths (at most 50)")
    summary = models.CharField(max_length=200, blank=True, help_text="the fix's first line")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING, db_index=True)
    created_at = models.DateTimeField()
    answered_at = models.DateTimeField(null=True, blank=True)
    answered_by = models.ForeignKey("accounts.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    answered_via = models.CharField(max_length=16, blank=True)  # device | console

    def __str__(self) -> str:
        return f"protected baseline: {', '.join(self.areas)} ({self.state})"
