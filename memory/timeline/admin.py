"""The timeline in the admin (registered through ``memory.admin``): read-only, each entry
linked to the run that answered it."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import F
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from accounts.owner_admin import OwnerContentAdmin, clip
from memory.timeline.models import TimelineEntry


@admin.register(TimelineEntry)
class TimelineEntryAdmin(OwnerContentAdmin):
    """The timeline; each entry links to the run that answered it: an utterance to the run
    it started (``Run.inbound``), a reply or notice to the run of the utterance it answers
    (``reply_to``). Read by the reverse relation's name, so memory imports nothing of brain."""

    list_display = ("seq", "kind", "short_text", "answered_by", "device", "scope", "created_at")
    list_filter = ("kind", "scope")
    search_fields = ("text",)
    ordering = ("-seq",)
    readonly_fields = ("answered_by",)

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).annotate(run_pk=Coalesce(F("run__id"), F("reply_to__run__id")))

    @admin.display(description="text")
    def short_text(self, obj: TimelineEntry) -> str:
        return clip(obj.text)

    @admin.display(description="run")
    def answered_by(self, obj: TimelineEntry) -> str:
        run_pk = getattr(obj, "run_pk", None)
        if run_pk is None:
            return "—"
        return format_html('<a class="run-link" href="{}">run {}</a>', reverse("admin:brain_run_change", args=[run_pk]), str(run_pk)[:8])

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_delete_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False
