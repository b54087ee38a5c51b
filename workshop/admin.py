"""Workshop builds in the admin, read-only: only ``workshop.builds`` writes them. The
candidate a build produced is reviewed on the registry's pages (by its digest)."""

from __future__ import annotations

from django.contrib import admin

from accounts.owner_admin import ReadOnlyOwnerAdmin
from workshop.models import WorkshopBuild


@admin.register(WorkshopBuild)
class WorkshopBuildAdmin(ReadOnlyOwnerAdmin):
    list_display = ("created_at", "pack", "state", "attempts", "max_attempts", "error_code", "candidate_state", "short_digest")
    list_filter = ("state", "error_code")
    readonly_fields = [f.name for f in WorkshopBuild._meta.fields]
    ordering = ("-created_at",)

    @admin.display(description="pack")
    def pack(self, obj: WorkshopBuild) -> str:
        return str(obj.spec.get("name") or obj.source or "—")

    @admin.display(description="candidate")
    def short_digest(self, obj: WorkshopBuild) -> str:
        return obj.candidate_digest[:12] or "—"
