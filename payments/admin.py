from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from accounts.owner_admin import OwnerContentAdmin
from payments.models import PaymentAuthorization, PaymentIntent


class AuthorizationInline(admin.TabularInline):
    model = PaymentAuthorization
    extra = 0
    fields = ("created_at", "method", "amount", "state", "authorized_at", "expires_at", "used_at", "void_reason")
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(PaymentIntent)
class PaymentIntentAdmin(OwnerContentAdmin):
    """Intents, their authorizations and how each ended. Read-only: payments change only
    through the payment authority."""

    list_display = ("created_at", "merchant", "payee", "amount", "currency", "state", "replacements")
    list_filter = ("state",)
    readonly_fields = [f.name for f in PaymentIntent._meta.fields]
    inlines = [AuthorizationInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: PaymentIntent | None = None) -> bool:
        return False
