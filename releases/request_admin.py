"""The owner's release actions in the console: ask to go back to the previous version (the
request form takes the owner's words and goes through ``releases.requested``), and answer
a protected-baseline card (``releases.baseline.answer_in_console``). Owner-only
(``OwnerContentAdmin``). Imported by ``releases.admin``."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from accounts.owner_admin import OwnerContentAdmin
from releases import baseline, requested
from releases.request_models import BaselineCard, RollbackRequest
from yimi_project.errors import YimiError


class RollbackRequestForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = RollbackRequest
        fields = ["reason"]
        labels = {"reason": "Why do you not want this version? (your own words)"}
        help_texts = {
            "reason": "It goes back to the previous version at the next quiet moment, if the version running then is "
            "still the one most recently switched in. Only code and configuration change: the database is not "
            "restored and nothing already done outside is undone."
        }


@admin.register(RollbackRequest)
class RollbackRequestAdmin(OwnerContentAdmin):
    list_display = ("requested_at", "reason", "from_build", "state", "to_build", "decided_at")
    list_filter = ("state",)
    form = RollbackRequestForm

    def get_readonly_fields(self, request: HttpRequest, obj: RollbackRequest | None = None) -> list[str]:
        return [f.name for f in RollbackRequest._meta.fields] if obj is not None else []

    def has_change_permission(self, request: HttpRequest, obj: RollbackRequest | None = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: RollbackRequest | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: RollbackRequest, form: Any, change: bool) -> None:
        """The request goes through ``request_rollback`` (one writer), never a bare save."""
        try:
            made = requested.request_rollback(request.user, obj.reason)
        except YimiError as exc:
            self.message_user(request, f"{exc.code}: {exc.message}", messages.ERROR)
            return
        obj.pk = made.pk
        obj.__dict__.update({f.attname: getattr(made, f.attname) for f in RollbackRequest._meta.concrete_fields})

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        return None if obj.pk is None else super().log_addition(request, obj, message)


@admin.register(BaselineCard)
class BaselineCardAdmin(OwnerContentAdmin):
    list_display = ("created_at", "release", "summary", "areas", "state", "answered_at", "answered_via")
    list_filter = ("state",)
    readonly_fields = [f.name for f in BaselineCard._meta.fields]
    actions = ["approve", "refuse"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: BaselineCard | None = None) -> bool:
        return False

    def _answer(self, request: HttpRequest, queryset: QuerySet[BaselineCard], answer: str) -> None:
        done = 0
        for card in queryset:
            try:
                baseline.answer_in_console(request.user.pk, card.id, answer)
                done += 1
            except YimiError as exc:
                self.message_user(request, f"{card}: {exc.code}: {exc.message}", messages.ERROR)
        if done:
            self.message_user(request, f"{answer}d {done} card(s).", messages.SUCCESS)

    @admin.action(description="Approve: let this change to the protected baseline go on")
    def approve(self, request: HttpRequest, queryset: QuerySet[BaselineCard]) -> None:
        self._answer(request, queryset, "approve")

    @admin.action(description="Refuse: end this candidate here")
    def refuse(self, request: HttpRequest, queryset: QuerySet[BaselineCard]) -> None:
        self._answer(request, queryset, "refuse")
