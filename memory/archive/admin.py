"""L5 originals in the admin (imported by ``memory.admin``): what the hot store holds, where
each original came from, and whether its hot copy is still there. Read-only: only
``memory.archive.raw_store`` writes these rows (erasure goes through ``memory.timeline.erasure``).

Cold packs in the admin (imported by ``memory.admin``): the packs with their state and
checks, the archive figures above them (the same lines as ``manage.py archive status``),
and the alerts. Read-only: only ``memory.archive.cold_store`` writes these rows."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse

from accounts.owner_admin import ReadOnlyOwnerAdmin
from memory.archive import cold_store as archive
from memory.archive.models import ColdAlert, ColdPack, RawObject


@admin.register(RawObject)
class RawObjectAdmin(ReadOnlyOwnerAdmin):
    list_display = ("started_at", "kind", "channel", "codec", "size", "copy", "stored_at")
    list_filter = ("kind", "channel")
    date_hierarchy = "started_at"
    ordering = ("-started_at",)
    readonly_fields = ("kind", "channel", "device_id", "codec", "stream", "stream_offset", "meta", "started_at", "ended_at",
                       "size", "sha256", "stored_at", "hot_deleted_at", "erased_at")
    exclude = ("owner", "hot_path")

    @admin.display(description="hot copy")
    def copy(self, obj: RawObject) -> Any:
        if obj.erased_at is not None:
            return "erased"
        return "deleted (cold only)" if obj.hot_deleted_at is not None else "hot"


@admin.register(ColdPack)
class ColdPackAdmin(ReadOnlyOwnerAdmin):
    list_display = ("path", "state", "object_count", "size", "decoded_size", "started_at", "verified_at",
                    "reverified_at", "released_at", "failure")
    list_filter = ("state",)
    ordering = ("-started_at",)
    readonly_fields = ("path", "state", "object_count", "size", "decoded_size", "sha256", "started_at", "verified_at",
                       "reverified_at", "released_at", "failure", "failure_detail", "replaced_by", "file_deleted_at")
    exclude = ("owner", "members")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        figures = archive.status(request.user.pk).lines()
        return super().changelist_view(request, {**(extra_context or {}), "archive_status": figures})


@admin.register(ColdAlert)
class ColdAlertAdmin(ReadOnlyOwnerAdmin):
    list_display = ("created_at", "code", "pack", "message")
    list_filter = ("code",)
    ordering = ("-created_at",)
    readonly_fields = ("created_at", "code", "pack", "message")
    exclude = ("owner",)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
