"""Owner content in the admin: one rule, applied by every admin that shows it.

Timeline entries, runs, assertions, consent cards, payment intents, devices and what they
heard, voiceprints, admissions, the owner's account and model settings are the owner's.
Only the owner (``accounts.services.is_owner``) sees them. Being staff or a superuser
grants nothing here: such an account — a pack reviewer, a second superuser — gets no
module on the index, an empty queryset, and 403 on every URL of these admins, the admin's
own views and any custom view a subclass adds (``urls`` wraps them all).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver

from accounts.services import is_owner


def owner_only_view(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Refuse (403) a signed-in account that is not the owner before ``view`` runs. An
    anonymous request goes on to the admin's own login redirect."""

    @functools.wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if getattr(request.user, "is_authenticated", False) and not is_owner(request.user):
            raise PermissionDenied("only the owner sees the owner's content")
        return view(request, *args, **kwargs)

    return guarded


def _guard(entry: URLPattern | URLResolver) -> URLPattern | URLResolver:
    if isinstance(entry, URLPattern):
        return URLPattern(entry.pattern, owner_only_view(entry.callback), entry.default_args, entry.name)
    return entry  # a ModelAdmin's URLs are plain patterns; nothing nests here


class OwnerContentAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Base (or first mixin) for every admin that shows the owner's content."""

    @property
    def urls(self) -> list[URLPattern | URLResolver]:  # type: ignore[override]
        return [_guard(entry) for entry in self.get_urls()]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset = super().get_queryset(request)
        return queryset if is_owner(request.user) else queryset.none()

    def has_module_permission(self, request: HttpRequest) -> bool:
        return is_owner(request.user) and super().has_module_permission(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_owner(request.user) and super().has_view_permission(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_owner(request.user) and super().has_change_permission(request, obj)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return is_owner(request.user) and super().has_add_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_owner(request.user) and super().has_delete_permission(request, obj)


class PlatformAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Base for an admin over the platform's own rows, not the owner's content (the pack
    registry, which staff review). Django's model permissions decide who sees it; every
    such admin is named in ``tests/accounts/test_owner_boundary.py``, so a new one is a reviewed
    decision, never a default."""


class ReadOnlyOwnerAdmin(OwnerContentAdmin):
    """An owner page over rows that only their app's services write: nothing is added,
    edited or deleted here (actions that call a service stay)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline):  # type: ignore[type-arg]
    """Rows shown inside an owner page that only their app's services write."""

    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _is_wide(char: str) -> bool:
    """A character that is a word on its own: CJK ideographs, kana, hangul, fullwidth forms."""
    code = ord(char)
    return (
        0x2E80 <= code <= 0x9FFF  # CJK radicals, punctuation, kana, ideographs
        or 0xAC00 <= code <= 0xD7AF  # hangul syllables
        or 0xF900 <= code <= 0xFAFF  # CJK compatibility ideographs
        or 0xFF00 <= code <= 0xFFEF  # fullwidth forms
        or 0x20000 <= code <= 0x3FFFF  # CJK extensions
    )


def clip(text: str, limit: int = 80) -> str:
    """``text`` on one line, at most ``limit`` characters plus "…" when cut. The cut falls on
    a word boundary (a space, or either side of a CJK character); a single word longer than
    half the limit is cut inside it rather than leaving almost nothing."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = limit
    while cut > limit // 2 and not (text[cut].isspace() or text[cut - 1].isspace() or _is_wide(text[cut]) or _is_wide(text[cut - 1])):
        cut -= 1
    if cut == limit // 2:
        cut = limit
    return text[:cut].rstrip() + "…"
