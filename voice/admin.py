from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from accounts.owner_admin import OwnerContentAdmin
from voice import face_admin  # noqa: F401  (registers the faces page)
from voice.models import VoiceUtterance


@admin.register(VoiceUtterance)
class VoiceUtteranceAdmin(OwnerContentAdmin):
    list_display = ("created_at", "device", "channel", "disposition", "scope", "reason", "band", "score", "voiced_ms", "transcript_source")
    list_filter = ("disposition", "scope", "channel")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: VoiceUtterance | None = None) -> bool:
        return False
