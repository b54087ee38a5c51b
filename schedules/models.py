"""Reminders, scheduled tasks and watches (models only). Each is written only by its module:
``schedules.reminders`` (``Reminder``), ``schedules.schedules`` (``Schedule``) and
``schedules.watches`` (``Watch``, ``WatchNotice``; geofences and followed parcels are
watches, made by ``schedules.geofences`` and ``schedules.parcels`` through it).

The tables keep the names they had in the ``brain`` app (``db_table``), so an installed
instance moved its models here without touching a row (``schedules/migrations/0001_initial.py``)."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class Reminder(models.Model):
    """A reminder the owner asked for (the ``schedule`` pack): fired into the timeline as a
    ``notice`` at ``due_at`` (``schedules.reminders.fire_due_reminders``)."""

    class State(models.TextChoices):
        SCHEDULED = "scheduled"
        FIRED = "fired"
        CANCELLED = "cancelled"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="reminders")
    text = models.CharField(max_length=500)
    due_at = models.DateTimeField(db_index=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.SCHEDULED, db_index=True)
    # The gateway's idempotency key of the call that created it: a retried create is the same reminder.
    idempotency_key = models.CharField(max_length=64, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    fired_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    fired_entry = models.ForeignKey("memory.TimelineEntry", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        db_table = "brain_reminder"
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="reminder_idempotency_key_unique_per_owner",
            )
        ]


class Schedule(models.Model):
    """A task the owner scheduled: ``prompt`` runs as a real run with ``origin=scheduled``
    every ``interval_seconds`` or daily at ``daily_at`` (local time). Exactly one of them."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="schedules")
    device = models.ForeignKey("accounts.Device", on_delete=models.PROTECT, related_name="schedules", help_text="the device its runs answer on")
    prompt = models.TextField(help_text="what to do, as the owner would say it")
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    daily_at = models.TimeField(null=True, blank=True, help_text="local time (TIME_ZONE)")
    next_run_at = models.DateTimeField(db_index=True)
    active = models.BooleanField(default=True, db_index=True)
    last_run = models.ForeignKey("brain.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "brain_schedule"
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(interval_seconds__isnull=False) & models.Q(daily_at__isnull=True))
                | (models.Q(interval_seconds__isnull=True) & models.Q(daily_at__isnull=False)),
                name="schedule_interval_xor_daily",
            )
        ]

    def __str__(self) -> str:
        return f"schedule {self.prompt[:40]!r}"


class Watch(models.Model):
    """A watch: call ``tool`` with ``arguments`` on a schedule, read a state from the receipt
    at ``state_path`` (dotted, e.g. ``content.state``), and notify once when the state moves
    to ``s_to`` from ``s_from`` (or from nothing known)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="watches")
    device = models.ForeignKey("accounts.Device", on_delete=models.PROTECT, related_name="watches", help_text="the device its runs are bound to")
    label = models.CharField(max_length=200, help_text="what the notice names, e.g. 快递 YT1234")
    tool = models.CharField(max_length=120, help_text="pack__tool, e.g. parcels__track")
    arguments = models.JSONField(default=dict, blank=True)
    state_path = models.CharField(max_length=200, default="content.state")
    s_from = models.CharField(max_length=64)
    s_to = models.CharField(max_length=64)
    interval_seconds = models.PositiveIntegerField(default=600)
    next_run_at = models.DateTimeField(db_index=True)
    active = models.BooleanField(default=True, db_index=True)
    last_state = models.CharField(max_length=64, blank=True)
    # A one-time watch notifies at most once and ends (inactive) when a device ACKs that
    # notice; a repeating one notifies each time the state moves to ``s_to`` again.
    once = models.BooleanField(default=False)
    last_checked_at = models.DateTimeField(null=True, blank=True)
    last_run = models.ForeignKey("brain.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "brain_watch"
        verbose_name_plural = "watches"

    def __str__(self) -> str:
        return f"watch {self.label!r} ({self.s_from} → {self.s_to})"


class WatchNotice(models.Model):
    """A watch's notice, written ``pending`` with its timeline entry before it is sent, and
    ``delivered`` only when a device ACKs that entry. ``id`` is the stable notice id every
    (re-)send carries."""

    class State(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    watch = models.ForeignKey(Watch, on_delete=models.CASCADE, related_name="notices")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    entry = models.OneToOneField("memory.TimelineEntry", on_delete=models.CASCADE, related_name="watch_notice")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING, db_index=True)
    sends = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    last_sent_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "brain_watchnotice"

    def __str__(self) -> str:
        return f"notice {self.id} ({self.state})"
