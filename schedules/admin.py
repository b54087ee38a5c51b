"""Reminders, scheduled tasks and watches, for the owner to audit. Read-only: this app's
services are the only writers (``schedules.reminders``, ``schedules.schedules``,
``schedules.watches``); the actions here call them."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from accounts.owner_admin import ReadOnlyOwnerAdmin, clip
from schedules import reminders, schedules, watches
from schedules.models import Reminder, Schedule, Watch, WatchNotice


@admin.action(description="Cancel the selected reminders")
def cancel_reminders(modeladmin, request, queryset):  # type: ignore[no-untyped-def]
    for reminder in queryset.filter(state=Reminder.State.SCHEDULED):
        reminders.cancel_reminder(request.user, reminder.pk)


@admin.register(Reminder)
class ReminderAdmin(ReadOnlyOwnerAdmin):
    """Reminders; they change only through ``schedules.reminders`` (the action cancels)."""

    list_display = ("due_at", "short_text", "state", "created_at", "fired_at", "cancelled_at")
    list_filter = ("state",)
    search_fields = ("text",)
    ordering = ("-due_at",)
    readonly_fields = [f.name for f in Reminder._meta.fields]
    actions = [cancel_reminders]

    @admin.display(description="text")
    def short_text(self, obj: Any) -> str:
        return clip(obj.text)


@admin.action(description="Cancel the selected (stop running them)")
def cancel_selected(modeladmin, request, queryset):  # type: ignore[no-untyped-def]
    cancel = schedules.cancel_schedule if queryset.model is Schedule else watches.cancel_watch
    for obj in queryset:
        cancel(request.user, obj.pk)


@admin.register(Schedule)
class ScheduleAdmin(ReadOnlyOwnerAdmin):
    list_display = ("prompt", "interval_seconds", "daily_at", "next_run_at", "active", "last_run")
    list_filter = ("active",)
    readonly_fields = [f.name for f in Schedule._meta.fields]
    actions = [cancel_selected]


@admin.register(Watch)
class WatchAdmin(ReadOnlyOwnerAdmin):
    list_display = ("label", "tool", "s_from", "s_to", "last_state", "next_run_at", "active")
    list_filter = ("active",)
    readonly_fields = [f.name for f in Watch._meta.fields]
    actions = [cancel_selected]


@admin.register(WatchNotice)
class WatchNoticeAdmin(ReadOnlyOwnerAdmin):
    list_display = ("id", "watch", "state", "sends", "created_at", "delivered_at")
    list_filter = ("state",)
    readonly_fields = [f.name for f in WatchNotice._meta.fields]
