"""Where the owner is and their health in the admin (registered through ``memory.admin``):
read-only pages; only ``memory.personal.location`` and ``memory.personal.health`` write these rows."""

from __future__ import annotations

from django.contrib import admin

from accounts.owner_admin import ReadOnlyOwnerAdmin
from memory.personal.models import HealthRecord, LocationReport, Place


@admin.register(LocationReport)
class LocationReportAdmin(ReadOnlyOwnerAdmin):
    list_display = ("at", "lat", "lon", "accuracy_m", "device_label", "received_at")
    list_filter = ("device_label",)
    date_hierarchy = "at"
    ordering = ("-at",)
    readonly_fields = ("at", "lat", "lon", "accuracy_m", "device_label", "client_id", "received_at")
    exclude = ("owner", "device")


@admin.register(Place)
class PlaceAdmin(ReadOnlyOwnerAdmin):
    list_display = ("name", "lat", "lon", "radius_m", "updated_at")
    search_fields = ("name",)
    ordering = ("name",)
    readonly_fields = ("name", "lat", "lon", "radius_m", "created_at", "updated_at")
    exclude = ("owner",)


@admin.register(HealthRecord)
class HealthRecordAdmin(ReadOnlyOwnerAdmin):
    list_display = ("start", "kind", "end", "device_label", "received_at")
    list_filter = ("kind", "device_kind")
    date_hierarchy = "start"
    ordering = ("-start",)
    readonly_fields = ("kind", "start", "end", "metrics", "device_label", "device_kind", "client_id", "received_at")
    exclude = ("owner", "device")
