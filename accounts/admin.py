from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from accounts.models import AdmissionRecord, ChannelThreshold, TrustWindow, User, VoiceCall, VoiceprintEnrollment
from accounts.owner_admin import OwnerContentAdmin


@admin.register(User)
class YimiUserAdmin(OwnerContentAdmin, UserAdmin):
    """Accounts, the owner's included: only the owner manages them (another superuser
    could otherwise reset the owner's password and become the owner)."""

    list_display = ("username", "is_owner", "is_staff", "time_zone")
    fieldsets = (*UserAdmin.fieldsets, ("Yimi", {"fields": ("is_owner", "time_zone")}))
    readonly_fields = ("is_owner",)


@admin.register(AdmissionRecord)
class AdmissionRecordAdmin(OwnerContentAdmin):
    list_display = ("created_at", "device", "channel", "scope", "reason")
    list_filter = ("scope", "channel")

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


class _ReadOnly(OwnerContentAdmin):
    """Voice identity is written by its services only; the admin shows it, to the owner."""

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(VoiceprintEnrollment)
class VoiceprintEnrollmentAdmin(_ReadOnly):
    list_display = ("channel", "model_key", "segment_count", "voiced_ms_total", "created_at", "updated_at")
    exclude = ("centroid",)


@admin.register(ChannelThreshold)
class ChannelThresholdAdmin(_ReadOnly):
    list_display = ("channel", "model_key", "value", "reason", "raised_at")

    def has_delete_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False  # a threshold only rises; deleting it would lower it


@admin.register(TrustWindow)
class TrustWindowAdmin(_ReadOnly):
    list_display = ("opened_at", "expires_at", "device", "method", "bound_call")


@admin.register(VoiceCall)
class VoiceCallAdmin(_ReadOnly):
    list_display = ("started_at", "ended_at", "device", "call_id", "channel")
