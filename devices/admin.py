from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from accounts.devices import issue_pairing_code, revoke_device
from accounts.models import Device, PairingCode
from accounts.owner_admin import OwnerContentAdmin
from devices.mac import admin as mac_admin  # noqa: F401  (registers the Mac command log)
from devices.models import Delivery


class RevokedFilter(admin.SimpleListFilter):
    title = "revoked"
    parameter_name = "revoked"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("no", "In use"), ("yes", "Revoked")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Device]) -> QuerySet[Device]:
        if self.value() == "no":
            return queryset.filter(revoked_at=None)
        if self.value() == "yes":
            return queryset.exclude(revoked_at=None)
        return queryset


@admin.register(Device)
class DeviceAdmin(OwnerContentAdmin):
    list_display = ("name", "kind", "is_guest", "last_seen_at", "revoked", "paired_at", "relay_via")
    list_filter = (RevokedFilter, "kind", "is_guest")
    search_fields = ("name",)
    ordering = ("revoked_at", "-last_seen_at")
    readonly_fields = ("id", "owner", "kind", "public_key", "capture_channels", "relay_via", "is_guest", "paired_at", "last_seen_at", "revoked_at")
    fields = ("id", "name", *readonly_fields[1:])
    actions = ["revoke"]

    @admin.display(description="revoked", ordering="revoked_at")
    def revoked(self, obj: Device) -> str:
        return f"revoked {obj.revoked_at:%Y-%m-%d %H:%M}" if obj.revoked_at else "no"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Device | None = None) -> bool:
        return False

    @admin.action(description="Revoke selected devices (closes their connections at once)")
    def revoke(self, request: HttpRequest, queryset: QuerySet[Device]) -> None:
        revoked = sum(revoke_device(d) for d in queryset)
        self.message_user(request, f"Revoked {revoked} device(s).", messages.SUCCESS)


@admin.register(PairingCode)
class PairingCodeAdmin(OwnerContentAdmin):
    """Only the owner pairs devices: the page (and ``issue_pairing_code``) refuses anyone else."""

    list_display = ("created_at", "for_guest", "expires_at", "used_at", "used_by")
    fields = ("for_guest",)

    def has_change_permission(self, request: HttpRequest, obj: PairingCode | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: PairingCode, form, change: bool) -> None:  # type: ignore[no-untyped-def]
        issued, code = issue_pairing_code(request.user, for_guest=obj.for_guest)
        obj.pk, obj.digest, obj.expires_at = issued.pk, issued.digest, issued.expires_at
        self.message_user(request, f"New pairing code (valid 10 minutes, single use): {code}", messages.WARNING)

    def response_add(self, request, obj, post_url_continue=None):  # type: ignore[no-untyped-def]
        from django.http import HttpResponseRedirect
        from django.urls import reverse

        return HttpResponseRedirect(reverse("admin:accounts_pairingcode_changelist"))


@admin.register(Delivery)
class DeliveryAdmin(OwnerContentAdmin):
    list_display = ("entry", "device", "status", "at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Delivery | None = None) -> bool:
        return False

