"""Releases and their history in the console, for the owner, read-only: what was built,
what the gate said, why a candidate was voided or failed, and every switch, rollback and
cleanup. Written only by ``releases.services`` (the pointers on disk are the truth of what
runs; ``manage.py release status`` shows them). Imported by ``releases.admin``."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from accounts.owner_admin import ReadOnlyInline, ReadOnlyOwnerAdmin, clip
from releases.models import Release, ReleaseEvent


class ReleaseEventInline(ReadOnlyInline):
    model = ReleaseEvent
    fields = ("at", "kind", "from_build", "to_build", "reason")
    readonly_fields = fields
    ordering = ("-at", "-id")


@admin.register(Release)
class ReleaseAdmin(ReadOnlyOwnerAdmin):
    list_display = ("created_at", "short_build", "commit_short", "state", "fix_line", "reason")
    list_filter = ("state", "kind")
    search_fields = ("build_id", "commit", "fix_line")
    readonly_fields = (
        "build_id", "kind", "commit", "base_commit", "path", "fix_line", "state", "state_reason", "gate_result",
        "created_at", "switched_at",
    )  # fmt: skip
    inlines = [ReleaseEventInline]

    @admin.display(description="build")
    def short_build(self, obj: Release) -> str:
        return obj.build_id[:20] + "…"

    @admin.display(description="commit")
    def commit_short(self, obj: Release) -> str:
        return obj.commit[:12]

    @admin.display(description="why")
    def reason(self, obj: Release) -> str:
        return clip(obj.state_reason, 80)


@admin.register(ReleaseEvent)
class ReleaseEventAdmin(ReadOnlyOwnerAdmin):
    list_display = ("at", "kind", "from_short", "to_short", "why")
    list_filter = ("kind",)
    readonly_fields = ("at", "kind", "release", "from_build", "to_build", "reason", "details")

    @admin.display(description="from")
    def from_short(self, obj: ReleaseEvent) -> str:
        return obj.from_build[:20]

    @admin.display(description="to")
    def to_short(self, obj: ReleaseEvent) -> str:
        return obj.to_build[:20]

    @admin.display(description="reason")
    def why(self, obj: ReleaseEvent) -> str:
        return clip(obj.reason, 100)

    def get_queryset(self, request: Any) -> Any:
        return super().get_queryset(request).select_related("release")
