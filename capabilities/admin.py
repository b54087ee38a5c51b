"""The receipt ledger in the admin: every tool call the gateway decided on, and every
receipt a pack (or the gateway) reported for it. Read-only: only the gateway writes the
ledger (``capabilities.services``, ``capabilities.receipts``); the owner audits it here."""

from __future__ import annotations

import json

from django.contrib import admin

from accounts.owner_admin import ReadOnlyInline, ReadOnlyOwnerAdmin, clip
from capabilities.models import ReceiptRecord, ToolCall


def receipt_line(record: ReceiptRecord) -> str:
    """One readable line for a receipt: revision, status, and its summary (or the receipt)."""
    body = record.receipt if isinstance(record.receipt, dict) else {}
    summary = next((str(body[k]) for k in ("summary", "message", "text", "reason") if body.get(k)), "")
    text = summary or json.dumps(record.receipt, ensure_ascii=False, sort_keys=True)
    flags = " · violations" if record.violations else ""
    return f"r{record.revision} {record.status}{flags}: {clip(text, 120)}"


class ReceiptInline(ReadOnlyInline):
    model = ReceiptRecord
    fields = ("revision", "status", "task_id", "receipt", "violations", "contradictions", "written_by_gateway", "created_at")
    readonly_fields = fields
    show_change_link = False


@admin.register(ToolCall)
class ToolCallAdmin(ReadOnlyOwnerAdmin):
    list_display = ("created_at", "tool", "category", "decision", "decision_code", "agent_id", "run", "receipts_summary")
    list_filter = ("decision", "category")
    search_fields = ("tool", "decision_code")
    list_select_related = ("run",)
    readonly_fields = [f.name for f in ToolCall._meta.fields]
    inlines = [ReceiptInline]
    ordering = ("-created_at",)

    @admin.display(description="receipts")
    def receipts_summary(self, obj: ToolCall) -> str:
        return "; ".join(receipt_line(r) for r in obj.receipts.order_by("revision")) or "—"


@admin.register(ReceiptRecord)
class ReceiptRecordAdmin(ReadOnlyOwnerAdmin):
    list_display = ("created_at", "task_id", "revision", "status", "tool", "summary", "written_by_gateway")
    list_filter = ("status", "written_by_gateway")
    search_fields = ("task_id",)
    list_select_related = ("call",)
    readonly_fields = [f.name for f in ReceiptRecord._meta.fields]
    ordering = ("-created_at",)

    @admin.display(description="tool")
    def tool(self, obj: ReceiptRecord) -> str:
        return obj.call.tool

    @admin.display(description="receipt")
    def summary(self, obj: ReceiptRecord) -> str:
        return receipt_line(obj)


# The pack registry's admin (packs, versions, candidates) has its own module, and so do
# the secret grants (the owner's: which pack may have which of the owner's secrets).
from capabilities import grant_admin, registry_admin  # noqa: E402, F401
