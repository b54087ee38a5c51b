from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from accounts.owner_admin import OwnerContentAdmin
from consent.models import ConsentCard, RememberedConsent, RidePermission
from consent.services import revoke_remembered


@admin.register(ConsentCard)
class ConsentCardAdmin(OwnerContentAdmin):
    list_display = ("created_at", "category", "tool", "target", "owner_requested", "state", "expires_at", "answered_at")
    list_filter = ("state", "category")
    readonly_fields = [f.name for f in ConsentCard._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: ConsentCard | None = None) -> bool:
        return False


@admin.register(RememberedConsent)
class RememberedConsentAdmin(OwnerContentAdmin):
    list_display = ("recipient", "task_type", "created_at", "revoked_at")
    list_filter = ("task_type",)
    readonly_fields = ("owner", "recipient", "task_type", "card", "created_at", "revoked_at")
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke: ask again before the next such send")
    def revoke(self, request: HttpRequest, queryset: QuerySet[RememberedConsent]) -> None:
        count = sum(revoke_remembered(c.id) for c in queryset)
        self.message_user(request, f"Revoked {count} remembered consent(s).", messages.SUCCESS)


@admin.register(RidePermission)
class RidePermissionAdmin(OwnerContentAdmin):
    list_display = ("granted_at", "expires_at", "revoked_at", "granted_by")
    readonly_fields = ("owner", "granted_by", "granted_at", "expires_at", "revoked_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
