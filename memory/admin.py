from django.contrib import admin

from memory.models import TimelineEntry


@admin.register(TimelineEntry)
class TimelineEntryAdmin(admin.ModelAdmin):
    list_display = ("seq", "kind", "short_text", "device", "scope", "created_at")
    list_filter = ("kind", "scope")
    search_fields = ("text",)
    ordering = ("-seq",)

    @admin.display(description="text")
    def short_text(self, obj: TimelineEntry) -> str:
        return obj.text[:80]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_delete_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False
