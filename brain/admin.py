"""Everything Yimi did, for the owner to audit: runs (the sentence that started each, its
scope, the reply, the tool calls with their receipts, the sub-agent tasks) and each run's
model calls on its page (``llm.admin``; the model pages are the llm app's, ``llm.admin``);
reminders, scheduled tasks and watches are ``schedules.admin``'s. Read-only:
``brain``'s services are the only writers; the actions here call them."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.safestring import mark_safe

from accounts.owner_admin import ReadOnlyInline, ReadOnlyOwnerAdmin, clip
from brain import trace
from brain.models import AgentTask, Run
from capabilities.admin import receipt_line
from capabilities.models import ToolCall
from llm.admin import ModelUsageInline  # also registers the model usage page


class ToolCallInline(ReadOnlyInline):
    model = ToolCall
    fields = ("created_at", "agent_id", "tool", "decision", "decision_code", "receipts")
    readonly_fields = fields
    ordering = ("created_at",)

    @admin.display(description="receipts")
    def receipts(self, obj: ToolCall) -> str:
        return "; ".join(receipt_line(r) for r in obj.receipts.order_by("revision")) or "—"


class AgentTaskInline(ReadOnlyInline):
    model = AgentTask
    fk_name = "run"
    fields = ("created_at", "kind", "depth", "goal", "state", "error_code", "short_result")
    readonly_fields = fields
    ordering = ("created_at",)

    @admin.display(description="result")
    def short_result(self, obj: AgentTask) -> str:
        return clip(obj.result, 160)


@admin.register(Run)
class RunAdmin(ReadOnlyOwnerAdmin):
    list_display = ("created_at", "sentence", "scope", "state", "reply", "tool_calls_used", "error_code")
    list_filter = ("state", "scope", "origin")
    search_fields = ("inbound__text", "result_entry__text")
    list_select_related = ("inbound", "result_entry")
    ordering = ("-created_at",)
    fields = ("started_by", "scope", "origin", "state", "answer", "error_code", "attempts", "tool_calls_used", "thinking",
              "origin_device", "created_at", "started_at", "finished_at", "trace_bar", "id")
    readonly_fields = fields
    inlines = [ToolCallInline, AgentTaskInline, ModelUsageInline]

    @admin.display(description="sentence")
    def sentence(self, obj: Run) -> str:
        return clip(obj.inbound.text)

    @admin.display(description="reply")
    def reply(self, obj: Run) -> str:
        return clip(obj.result_entry.text) if obj.result_entry else "—"

    @admin.display(description="the sentence that started it")
    def started_by(self, obj: Run) -> str:
        return obj.inbound.text

    @admin.display(description="the reply")
    def answer(self, obj: Run) -> str:
        return obj.result_entry.text if obj.result_entry else "—"

    @admin.display(description="trace (ms from the frame's arrival)")
    def trace_bar(self, obj: Run) -> str:
        return mark_safe(trace.render_bar(obj.trace))  # noqa: S308 - rendered by a template, every value escaped there

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(AgentTask)
class AgentTaskAdmin(ReadOnlyOwnerAdmin):
    """Sub-agent tasks; they change only through ``brain.agents``."""

    list_display = ("created_at", "short_goal", "kind", "depth", "state", "error_code", "run", "finished_at")
    list_filter = ("state", "kind")
    search_fields = ("goal", "result")
    ordering = ("-created_at",)
    readonly_fields = [f.name for f in AgentTask._meta.fields]

    @admin.display(description="goal")
    def short_goal(self, obj: AgentTask) -> str:
        return clip(obj.goal)

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).filter(run__owner_id=request.user.pk)
