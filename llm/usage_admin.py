"""The console's usage page, ``/admin/llm/modelusage/``: model calls by role and by day as
a server-rendered SVG plot and a table, then the latest calls; and the inline that lists a
run's model calls on its page. Read-only: ``llm.usage`` is the only writer."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.safestring import mark_safe

from accounts.owner_admin import ReadOnlyInline, ReadOnlyOwnerAdmin
from llm import usage
from llm.usage_models import ModelUsage
from yimi_project.errors import YimiError

DEFAULT_DAYS = 14
MAX_DAYS = 90
RECENT_CALLS = 50


@admin.register(ModelUsage)
class ModelUsageAdmin(ReadOnlyOwnerAdmin):
    list_display = ("created_at", "role", "provider", "model", "tokens", "cost_display", "duration_ms", "outcome", "run")
    readonly_fields = [f.name for f in ModelUsage._meta.fields]

    @admin.display(description="tokens")
    def tokens(self, obj: ModelUsage) -> str:
        return usage.tokens_text(obj)

    @admin.display(description="cost")
    def cost_display(self, obj: ModelUsage) -> str:
        return usage.cost_text(obj)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        days = DEFAULT_DAYS
        raw = request.GET.get("days")
        if raw is not None:
            if raw.isdigit() and 1 <= int(raw) <= MAX_DAYS:
                days = int(raw)
            else:
                messages.error(request, f"days must be a whole number from 1 to {MAX_DAYS}; showing {DEFAULT_DAYS}.")
        summary = usage.usage_summary(days)
        prices_error = ""
        try:
            priced = len(usage.load_prices())
        except YimiError as exc:
            priced, prices_error = 0, exc.message
        recent = list(self.get_queryset(request).select_related("run", "run__inbound")[:RECENT_CALLS])
        context = {
            **self.admin_site.each_context(request),
            "title": "Model usage",
            "opts": self.model._meta,
            "days": days,
            "plot": mark_safe(usage.usage_plot_svg(summary)),  # noqa: S308 - built by usage_plot_svg, every text escaped
            "rows": summary.rows,
            "totals": usage.by_role_totals(summary.rows).values(),
            "recent": [(row, usage.tokens_text(row), usage.cost_text(row)) for row in recent],
            "prices_file": usage.prices_file(),
            "priced_models": priced,
            "prices_error": prices_error,
        }
        return TemplateResponse(request, "admin/llm/model_usage.html", context)


class ModelUsageInline(ReadOnlyInline):
    """A run's model calls, on the run's page."""

    model = ModelUsage
    fk_name = "run"
    fields = ("created_at", "role", "provider", "model", "tokens", "cost_display", "duration_ms", "outcome", "agent_task")
    readonly_fields = fields
    ordering = ("created_at",)
    show_change_link = False
    verbose_name = "model call"
    verbose_name_plural = "model calls"

    @admin.display(description="tokens")
    def tokens(self, obj: ModelUsage) -> str:
        return usage.tokens_text(obj)

    @admin.display(description="cost")
    def cost_display(self, obj: ModelUsage) -> str:
        return usage.cost_text(obj)
