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
