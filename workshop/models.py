"""The workshop's one table: builds (flow F4).

Only ``workshop.builds`` writes it.
"""

from __future__ import annotations

import uuid

from django.db import models


class WorkshopBuild(models.Model):
    """One build: a spec (or a pack draft) built, self-tested in the sandbox, repaired and
    tried again up to ``max_attempts`` times, and handed to the registry as a candidate."""

    class State(models.TextChoices):
        QUEUED = "queued"
        BUILDING = "building"  # copying and filling the template (or repairing the spec)
        TESTING = "testing"  # the self-test runs in the sandbox
        SUCCEEDED = "succeeded"  # handed to the registry (candidate_digest) and, for Yimi's builds, published
        FAILED = "failed"  # error_code says why

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    spec = models.JSONField(default=dict, blank=True, help_text="the build spec as it is now (repairs replace it)")
    source = models.CharField(max_length=500, blank=True, help_text="a pack draft's directory, when built from one")
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    attempts = models.PositiveSmallIntegerField(default=0)
    max_attempts = models.PositiveSmallIntegerField(default=3)
    log_tail = models.TextField(blank=True, help_text="the end of the last attempt's self-test output")
    candidate_digest = models.CharField(max_length=64, blank=True)
    candidate_state = models.CharField(max_length=16, blank=True, help_text="the registry's verdict: passed or refused")
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.spec.get('name') or self.source or self.id} ({self.state}, attempt {self.attempts}/{self.max_attempts})"
