"""The Mac command log in the console: owner only, read-only (written by devices/mac/relay.py)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from accounts.owner_admin import OwnerContentAdmin
from devices.mac.models import MacOperation


@admin.register(MacOperation)
class MacOperationAdmin(OwnerContentAdmin):
    """What Yimi asked of the owner's Mac: kind, target, outcome, exit code, size and digest.
    Contents, output and screenshots are never stored, so never shown."""

    list_display = ("requested_at", "kind", "target", "outcome", "error_code", "exit_code", "size_bytes", "device")
    list_filter = ("kind", "outcome")
    search_fields = ("target", "tool", "call_id")
    ordering = ("-requested_at",)
    readonly_fields = [f.name for f in MacOperation._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
