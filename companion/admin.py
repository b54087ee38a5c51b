"""The companion in the admin (issue 21): persona versions (publish, rename by publishing,
point back), content cards, the continuity switch, and, read-only, call snapshots and the
privacy epoch. Every write goes through the services: ``companion.persona``,
``companion.content_cards``, ``companion.privacy_epoch``."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest

from accounts.owner_admin import OwnerContentAdmin, ReadOnlyOwnerAdmin, clip
from companion import content_cards, persona, privacy_epoch
from companion.models import CallSnapshot, CompanionSettings, ContentCard, PersonaVersion, PrivacyEpoch
from companion.snapshot import is_valid
from yimi_project.errors import YimiError

PERSONA_FIELDS = ("name", "identity", "rhythm", "fact_boundaries", "examples", "note")


class PersonaForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = PersonaVersion
        fields = PERSONA_FIELDS

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            persona.validate(data)
        except YimiError as exc:
            raise ValidationError(f"{exc.code}: {exc.message}") from exc
        return data


@admin.action(description="Point back to the version before the effective one")
def point_back(modeladmin: Any, request: HttpRequest, queryset: Any) -> None:
    try:
        version = persona.point_back(request.user.pk)
    except YimiError as exc:
        modeladmin.message_user(request, exc.message, messages.ERROR)
        return
    modeladmin.message_user(request, f"Version {version.version} ({version.name}) is effective again; the next call start applies it.")


@admin.register(PersonaVersion)
class PersonaVersionAdmin(OwnerContentAdmin):
    """A published version is never edited: "Add" publishes the next one (prefilled with
    the effective version, so a rename is a new name and Save)."""

    form = PersonaForm
    list_display = ("version", "name", "effective", "note", "created_at")
    ordering = ("-version",)
    actions = [point_back]

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).filter(owner_id=request.user.pk)

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        current = persona.effective(request.user.pk)
        return {f: getattr(current, f) for f in PERSONA_FIELDS if f != "note"}

    def save_model(self, request: HttpRequest, obj: PersonaVersion, form: Any, change: bool) -> None:
        published = persona.publish(request.user.pk, {f: form.cleaned_data.get(f) for f in PERSONA_FIELDS}, note=form.cleaned_data.get("note") or "")
        obj.pk, obj.version, obj.owner_id, obj.effective = published.pk, published.version, published.owner_id, True

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ContentCardForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = ContentCard
        fields = ("id", "mode", "title", "opening", "followups", "source", "tags", "estimated_duration", "active")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            content_cards.validate(ContentCard(**{k: v for k, v in data.items() if k in self.Meta.fields}))
        except YimiError as exc:
            raise ValidationError(f"{exc.code}: {exc.message}") from exc
        return data


@admin.register(ContentCard)
class ContentCardAdmin(OwnerContentAdmin):
    """Maintained by the owner (every admin page is the owner's: tests/accounts/test_owner_boundary);
    each change is a new version."""

    form = ContentCardForm
    list_display = ("id", "version", "mode", "title", "active", "estimated_duration", "story_told_as")
    list_filter = ("mode", "active")
    readonly_fields = ("version", "updated_at")

    @admin.display(description="told as")
    def story_told_as(self, obj: ContentCard) -> str:
        return f"source: {clip(obj.source, 40)}" if obj.source else "a story, never news"

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ("id", *self.readonly_fields) if obj is not None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: ContentCard, form: Any, change: bool) -> None:
        content_cards.save_card(obj, created=not change)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a card a snapshot names stays; set it inactive instead


@admin.register(CompanionSettings)
class CompanionSettingsAdmin(OwnerContentAdmin):
    """The continuity switch; turning it off moves the privacy epoch (companion.privacy_epoch)."""

    fields = ("continuity_enabled",)
    list_display = ("owner", "continuity_enabled", "updated_at")

    def save_model(self, request: HttpRequest, obj: CompanionSettings, form: Any, change: bool) -> None:
        privacy_epoch.set_continuity(request.user.pk, bool(form.cleaned_data["continuity_enabled"]))
        obj.pk = CompanionSettings.objects.get(owner_id=request.user.pk).pk

    def has_add_permission(self, request: HttpRequest) -> bool:
        return super().has_add_permission(request) and not CompanionSettings.objects.filter(owner_id=request.user.pk).exists()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(CallSnapshot)
class CallSnapshotAdmin(ReadOnlyOwnerAdmin):
    list_display = ("call", "built_at", "persona_version", "short_opening", "card", "fallback", "error", "epoch", "valid")
    list_filter = ("fallback",)
    ordering = ("-built_at",)

    @admin.display(description="opening")
    def short_opening(self, obj: CallSnapshot) -> str:
        return clip(obj.opening, 60)

    @admin.display(boolean=True, description="current epoch")
    def valid(self, obj: CallSnapshot) -> bool:
        return is_valid(obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(PrivacyEpoch)
class PrivacyEpochAdmin(ReadOnlyOwnerAdmin):
    list_display = ("owner", "value", "reason", "changed_at")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
