"""L5 originals in the admin (imported by ``memory.admin``): what the hot store holds, where
each original came from, and whether its hot copy is still there. Read-only: only
``memory.raw_store`` writes these rows (erasure goes through ``memory.erasure``)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from accounts.owner_admin import ReadOnlyOwnerAdmin
from memory.raw_models import RawObject


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
