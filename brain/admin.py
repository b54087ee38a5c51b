from django.contrib import admin

from accounts.owner_admin import OwnerContentAdmin
from brain import catalog_admin  # noqa: F401  (registers the local-models settings page)
from brain.models import Run


@admin.register(Run)
class RunAdmin(OwnerContentAdmin):
    list_display = ("id", "scope", "state", "attempts", "error_code", "created_at", "finished_at")
    list_filter = ("state", "scope")
    readonly_fields = [f.name for f in Run._meta.fields]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


from brain import schedules, watches  # noqa: E402
from brain.schedule_models import Schedule, Watch, WatchNotice  # noqa: E402


@admin.action(description="Cancel the selected (stop running them)")
def cancel_selected(modeladmin, request, queryset):  # type: ignore[no-untyped-def]
    cancel = schedules.cancel_schedule if queryset.model is Schedule else watches.cancel_watch
    for obj in queryset:
        cancel(request.user, obj.pk)


@admin.register(Schedule)
class ScheduleAdmin(OwnerContentAdmin):
    list_display = ("prompt", "interval_seconds", "daily_at", "next_run_at", "active", "last_run")
    list_filter = ("active",)
    readonly_fields = [f.name for f in Schedule._meta.fields]
    actions = [cancel_selected]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(Watch)
class WatchAdmin(OwnerContentAdmin):
    list_display = ("label", "tool", "s_from", "s_to", "last_state", "next_run_at", "active")
    list_filter = ("active",)
    readonly_fields = [f.name for f in Watch._meta.fields]
    actions = [cancel_selected]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(WatchNotice)
class WatchNoticeAdmin(OwnerContentAdmin):
    list_display = ("id", "watch", "state", "sends", "created_at", "delivered_at")
    list_filter = ("state",)
    readonly_fields = [f.name for f in WatchNotice._meta.fields]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False
