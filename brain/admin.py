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
