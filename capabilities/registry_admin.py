"""The pack registry in the admin, for staff who review packs (a pack reviewer need not be
the owner: packs are not the owner's content, Django's model permissions decide).

- Packs: every shipped or published pack with its switch, whether it is on now, the
  version online, its manifest, its version history with the monitoring figures. The list
  records the shipped packs first (``record_shipped_versions``: a fresh instance lists
  them all). Each row has on / off / default buttons (``switch_view``); actions turn the
  selected packs on, off, back to their default, or revert their online version. A switch
  takes effect without a restart (the selection file every process's loader reads);
  ``YIMI_PACKS_DISABLE`` still wins over it, and "default" follows ``YIMI_PACKS_ENABLE``
  and the manifest (``capabilities.manifest.load_packs``).
- Candidates: what the workshop or an operator handed in, with the static and honesty
  check results (rule codes and file names, never file contents).

Nothing is edited in a form: the actions call the registry's services
(``capabilities.registry.publish``), which write the tables and the selection file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from accounts.owner_admin import PlatformAdmin
from capabilities.manifest import load_packs
from capabilities.registry.publish import record_shipped_versions, revert, set_enabled
from capabilities.registry_models import PackCandidate, PackVersion, RegisteredPack
from yimi_project.errors import YimiError


def pretty(data: Any) -> str:
    return format_html("<pre style='white-space:pre-wrap'>{}</pre>", json.dumps(data, ensure_ascii=False, indent=2, sort_keys=True))


class ReviewOnlyAdmin(PlatformAdmin):
    """Rows only the registry's services write: viewed here, never added, edited or deleted."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in self.model._meta.fields] + list(self.readonly_fields)


class VersionInline(admin.TabularInline):  # type: ignore[type-arg]
    model = PackVersion
    fk_name = "pack"
    fields = ("activated_at", "origin", "version", "digest", "state", "ended_at", "end_reason", "monitoring_figures")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("-activated_at",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="monitoring")
    def monitoring_figures(self, obj: PackVersion) -> str:
        figures = obj.monitoring or {}
        if not figures:
            return "—"
        new, old = figures.get("new", {}), figures.get("old", {})
        line = f"{figures.get('action')} (health {figures.get('health')}): new {new.get('bad')}/{new.get('finished')}"
        line += f" [{new.get('low')}, {new.get('high')}]"
        if old:
            line += f"; old {old.get('bad')}/{old.get('finished')} [{old.get('low')}, {old.get('high')}]"
        return line


SWITCHES = {"on": True, "off": False, "default": None}
SWITCH_RULE = (
    "A switch takes effect at once, no restart. YIMI_PACKS_DISABLE (the deployment's) wins over it; "
    "'default' follows YIMI_PACKS_ENABLE, then the pack's manifest."
)


def state_now(name: str) -> str:
    """Whether the loader serves ``name`` now, and why not."""
    packs = load_packs()
    if name in packs.packs:
        return "on"
    return f"off: {packs.disabled[name]}" if name in packs.disabled else packs.refused.get(name, "not loaded")


@admin.register(RegisteredPack)
class RegisteredPackAdmin(ReviewOnlyAdmin):
    list_display = ("name", "source", "state_now", "switch", "switch_buttons", "online_version")
    search_fields = ("name",)
    inlines = [VersionInline]
    readonly_fields = ("state_now", "manifest")
    actions = ["turn_on", "turn_off", "follow_default", "revert_online_version"]
    ordering = ("name",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[RegisteredPack]:
        return super().get_queryset(request).select_related("active")

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        record_shipped_versions()  # a fresh instance lists its shipped packs; one query when none changed
        return super().changelist_view(request, {"subtitle": SWITCH_RULE, **(extra_context or {})})

    def get_urls(self) -> list[URLPattern]:  # type: ignore[override]
        switch = path("<int:pk>/switch/", self.admin_site.admin_view(self.switch_view), name="capabilities_registeredpack_switch")
        return [switch, *super().get_urls()]

    @admin.display(description="turn")
    def switch_buttons(self, obj: RegisteredPack) -> str:
        """Buttons inside the list's form, each posting it to ``switch_view`` for this pack."""
        url = reverse("admin:capabilities_registeredpack_switch", args=[obj.pk])
        current = {True: "on", False: "off", None: "default"}[obj.enabled]
        return format_html(
            "".join(
                f'<button type="submit" class="pack-switch" formaction="{{0}}" name="switch" value="{value}"'
                f' data-pack="{{1}}"{" disabled" if value == current else ""}>{value}</button> '
                for value in SWITCHES
            ),
            url, obj.name,
        )

    def switch_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        return require_POST(self._switch)(request, pk)

    def _switch(self, request: HttpRequest, pk: int) -> HttpResponse:
        """Set one pack's switch (``capabilities.registry.set_enabled``, the only writer) and
        say what the pack is now."""
        if not self.has_change_permission(request):
            raise PermissionDenied("changing a pack's switch needs the change permission")
        entry = get_object_or_404(RegisteredPack, pk=pk)
        value = request.POST.get("switch", "")
        if value not in SWITCHES:
            self.message_user(request, f"{entry.name}: invalid_request: the switch is on, off or default, not {value[:20]!r}", messages.ERROR)
        else:
            try:
                set_enabled(entry.name, SWITCHES[value])
            except YimiError as exc:
                self.message_user(request, f"{entry.name}: {exc.code}: {exc.message}", messages.ERROR)
            else:
                now = state_now(entry.name)
                # "on" that stays off (YIMI_PACKS_DISABLE, a refused manifest) is a warning
                level = messages.WARNING if value != "default" and (value == "on") != (now == "on") else messages.SUCCESS
                self.message_user(request, f"{entry.name}: switch {value}; the pack is {now}", level)
        return HttpResponseRedirect(reverse("admin:capabilities_registeredpack_changelist"))

    @admin.display(description="source")
    def source(self, obj: RegisteredPack) -> str:
        return "published" if obj.active_id else "shipped" if (Path(settings.YIMI_PACKS_DIR) / obj.name).is_dir() else "removed"

    @admin.display(description="now")
    def state_now(self, obj: RegisteredPack) -> str:
        return state_now(obj.name)

    @admin.display(description="switch")
    def switch(self, obj: RegisteredPack) -> str:
        return {True: "on", False: "off", None: "default"}[obj.enabled]

    @admin.display(description="online")
    def online_version(self, obj: RegisteredPack) -> str:
        return f"{obj.active.version} ({obj.active.digest[:12]})" if obj.active else "—"

    @admin.display(description="manifest")
    def manifest(self, obj: RegisteredPack) -> str:
        if obj.active is not None and obj.active.candidate is not None:
            return pretty(obj.active.candidate.manifest)
        path = Path(settings.YIMI_PACKS_DIR) / obj.name / "plugin.json"
        try:
            return pretty(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return "—"

    def _each(self, request: HttpRequest, queryset: QuerySet[RegisteredPack], act: Any, done: str) -> None:
        for entry in queryset:
            try:
                act(entry)
            except YimiError as exc:
                self.message_user(request, f"{entry.name}: {exc.code}: {exc.message}", messages.ERROR)
            else:
                self.message_user(request, f"{entry.name}: {done}")

    @admin.action(description="Turn on", permissions=["change"])
    def turn_on(self, request: HttpRequest, queryset: QuerySet[RegisteredPack]) -> None:
        self._each(request, queryset, lambda e: set_enabled(e.name, True), "turned on")

    @admin.action(description="Turn off", permissions=["change"])
    def turn_off(self, request: HttpRequest, queryset: QuerySet[RegisteredPack]) -> None:
        self._each(request, queryset, lambda e: set_enabled(e.name, False), "turned off")

    @admin.action(description="Back to the default switch", permissions=["change"])
    def follow_default(self, request: HttpRequest, queryset: QuerySet[RegisteredPack]) -> None:
        self._each(request, queryset, lambda e: set_enabled(e.name, None), "follows YIMI_PACKS_ENABLE and its manifest again")

    @admin.action(description="Revert the online version", permissions=["change"])
    def revert_online_version(self, request: HttpRequest, queryset: QuerySet[RegisteredPack]) -> None:
        who = request.user.get_username()
        self._each(request, queryset, lambda e: revert(e.name, reason=f"reverted in the admin by {who}"[:300]), "reverted")


@admin.register(PackCandidate)
class PackCandidateAdmin(ReviewOnlyAdmin):
    list_display = ("created_at", "name", "version", "origin", "state", "short_digest", "codes")
    list_filter = ("state", "origin")
    search_fields = ("name", "digest")
    readonly_fields = ("static_findings", "honesty_results", "manifest_view")
    exclude = ("static_report", "honesty_report", "manifest")
    ordering = ("-created_at",)

    @admin.display(description="digest")
    def short_digest(self, obj: PackCandidate) -> str:
        return obj.digest[:12]

    @admin.display(description="refused for")
    def codes(self, obj: PackCandidate) -> str:
        found = {f["code"] for f in obj.static_report} | {f["code"] for f in (obj.honesty_report or {}).get("findings", [])}
        return ", ".join(sorted(found)) or "—"

    @admin.display(description="static checks")
    def static_findings(self, obj: PackCandidate) -> str:
        return pretty(obj.static_report) if obj.static_report else "passed"

    @admin.display(description="honesty checks")
    def honesty_results(self, obj: PackCandidate) -> str:
        return pretty(obj.honesty_report) if obj.honesty_report else "not run"

    @admin.display(description="manifest")
    def manifest_view(self, obj: PackCandidate) -> str:
        return pretty(obj.manifest) if obj.manifest else "—"

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        hidden = set(self.exclude or ())
        return [f.name for f in self.model._meta.fields if f.name not in hidden] + list(self.readonly_fields)
