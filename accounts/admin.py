from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from accounts.models import AdmissionRecord, User


@admin.register(User)
class YimiUserAdmin(UserAdmin):
    list_display = ("username", "is_owner", "is_staff", "time_zone")
    fieldsets = (*UserAdmin.fieldsets, ("Yimi", {"fields": ("is_owner", "time_zone")}))
    readonly_fields = ("is_owner",)


@admin.register(AdmissionRecord)
class AdmissionRecordAdmin(admin.ModelAdmin):
    list_display = ("created_at", "device", "channel", "scope", "reason")
    list_filter = ("scope", "channel")

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False
