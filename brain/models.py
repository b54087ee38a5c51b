"""The run core's tables: ``Run`` (one utterance answered; written by ``brain.services``, but
its ``tool_calls_used`` by ``brain.agents`` and its ``model_roles`` by ``brain.run_pins``) and
``AgentTask`` (one sub-agent's delegated work; written only by ``brain.agents``)."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class Run(models.Model):
    """One agent run: an inbound utterance answered by the brain.

    Bound to its admission record (who spoke, in which scope). States move only forward,
    by conditional UPDATEs in ``brain.services``:
    queued → running → succeeded | failed | expired.
    """

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        EXPIRED = "expired"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="runs")
    admission = models.OneToOneField("accounts.AdmissionRecord", on_delete=models.PROTECT, related_name="run")
    inbound = models.OneToOneField("memory.TimelineEntry", on_delete=models.PROTECT, related_name="run")
    origin_device = models.ForeignKey("accounts.Device", on_delete=models.PROTECT, related_name="runs")
    class Origin(models.TextChoices):
        INTERACTIVE = "interactive"  # the owner (or a guest) said something
        SCHEDULED = "scheduled"  # a scheduled task: nobody is there to answer a card

    scope = models.CharField(max_length=16)
    origin = models.CharField(max_length=16, choices=Origin.choices, default=Origin.INTERACTIVE)
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    # When the recovery sweep last put the run on the queue again (None: only its first
    # message, sent at creation); brain.services.runs_to_recover.
    enqueued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    result_entry = models.ForeignKey(
        "memory.TimelineEntry", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    error_code = models.CharField(max_length=32, blank=True)
    # When each stage of the utterance's way happened ({stage: epoch ms}, brain.trace):
    # written with the run's INSERT, the UPDATE that closes it and the device's ACK.
    trace = models.JSONField(null=True, blank=True)
    # One tool-call budget for the whole delegation tree, counted by conditional UPDATE.
    tool_calls_used = models.PositiveIntegerField(default=0)
    # The thinking switch of the main turn, decided per turn (brain.prompts.decide_thinking);
    # None until the turn asked the brain.
    thinking = models.BooleanField(null=True, blank=True)
    # The model-role versions this run's tree uses, pinned when it starts ({role:
    # {"configured_as", "version"}}, llm.roles.for_run): a change applied meanwhile
    # takes effect for the next run only.
    model_roles = models.JSONField(null=True, blank=True)

    def __str__(self) -> str:
        return f"run {self.id} ({self.state})"


class AgentTask(models.Model):
    """A sub-agent's work, delegated from a run's main agent (depth 1) or from another
    sub-agent (depth 2). States move forward only: queued → running → succeeded | failed.
    """

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    class Kind(models.TextChoices):
        TASK = "task"  # the work the main agent (or a sub-agent) delegated
        SELF_CHECK = "self_check"  # one read-only look at why its parent task failed

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="agent_tasks")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.TASK)
    # Ran inside its delegator's turn (the pool was full, or it is a depth-2 / self-check task).
    synchronous = models.BooleanField(default=False)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="children")
    depth = models.PositiveSmallIntegerField(default=1)
    goal = models.TextField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED, db_index=True)
    result = models.TextField(blank=True)
    error_code = models.CharField(max_length=32, blank=True)
    # Owner additions waiting for the next tool-result boundary.
    steer_pending = models.JSONField(default=list, blank=True)
    steer_delivered = models.JSONField(default=list, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The follow-up turn that told the owner the result (at most one).
    reported_entry = models.ForeignKey("memory.TimelineEntry", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["parent"], condition=models.Q(kind="self_check"), name="brain_one_self_check_per_task"
            ),
        ]

    def __str__(self) -> str:
        return f"agent task {self.id} ({self.state})"


