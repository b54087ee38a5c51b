"""Secret grants in the admin: which pack may have which of the owner's secrets.

The owner's page (``OwnerContentAdmin``): a pack reviewer or a second superuser cannot
hand the owner's CardDAV password to a pack. The secrets themselves stay files in the
secrets directory; this page says which pack gets which of them. Add a grant (pack,
origin, secret name); the actions revoke the selected grants or grant them again. Nothing
is edited in place: every change goes through ``capabilities.registry.grants``, which
writes the row and the projection the pack hosts read. A revocation counts from the
pack's next host start.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from accounts.owner_admin import OwnerContentAdmin
from capabilities.registry import grants
from capabilities.registry_models import SecretGrant
from yimi_project.errors import YimiError


class GrantForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = SecretGrant
        fields = ("pack_name", "origin", "secret")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            grants.validate_grant(data.get("pack_name", ""), data.get("secret", ""), data.get("origin", ""))
        except YimiError as exc:
            raise forms.ValidationError(f"{exc.code}: {exc.message}") from None
        return data

    def validate_unique(self) -> None:
        """A revoked grant is granted again by the service, not refused as a duplicate."""


@admin.register(SecretGrant)
class SecretGrantAdmin(OwnerContentAdmin):
    form = GrantForm
    list_display = ("pack_name", "origin", "secret", "state", "granted_by", "granted_at", "revoked_by", "revoked_at")
    list_filter = ("granted", "origin")
    search_fields = ("pack_name", "secret")
    actions = ["revoke_selected", "grant_again"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a revoked grant stays, so yimi_init never grants it back

    @admin.display(description="state")
    def state(self, obj: SecretGrant) -> str:
        return "granted" if obj.granted else "revoked"

    def save_model(self, request: HttpRequest, obj: SecretGrant, form: Any, change: bool) -> None:
        saved = grants.grant(obj.pack_name, obj.secret, origin=obj.origin, by=f"admin: {request.user.get_username()}")
        obj.pk = saved.pk  # the add view's redirect and message name the row the service wrote

    def _each(self, request: HttpRequest, queryset: QuerySet[SecretGrant], act: Any, done: str) -> None:
        who = f"admin: {request.user.get_username()}"
        for row in queryset:
            try:
                act(row, who)
            except YimiError as exc:
                self.message_user(request, f"{row.secret} → {row.pack_name}: {exc.code}: {exc.message}", messages.ERROR)
            else:
                self.message_user(request, f"{row.secret} → {row.pack_name} ({row.origin}): {done}")

    @admin.action(description="Revoke (from the pack's next host start)")
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[SecretGrant]) -> None:
        self._each(request, queryset, lambda row, who: grants.revoke(row.pack_name, row.secret, origin=row.origin, by=who),
                   "revoked; the pack's next host start goes without it")

    @admin.action(description="Grant again")
    def grant_again(self, request: HttpRequest, queryset: QuerySet[SecretGrant]) -> None:
        self._each(request, queryset, lambda row, who: grants.grant(row.pack_name, row.secret, origin=row.origin, by=who),
                   "granted; the pack's next host start gets it")
