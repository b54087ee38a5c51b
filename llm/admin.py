"""The console's model pages: local models, model roles, model drafts and model usage
(whose inline also lists each run's model calls on brain's run page). Read-only: the llm
app's services are the only writers; the pages' actions call them.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.safestring import mark_safe

from accounts.owner_admin import ReadOnlyInline, ReadOnlyOwnerAdmin
from llm import catalog, keyring, model_settings, role_drafts, roles, usage
from llm.models import ModelRole, ModelRoleDraft, ModelSelection, ModelSwitch, ModelUsage
from yimi_project.errors import YimiError
from yimi_project.ids import uuid_or_nil

# --- the local models settings page ------------------------------------------------------------
# The settings page for local models: ``/admin/llm/modelselection/``.
#
# For each kind it shows the selected, effective and previous versions, what the switch
# is waiting for, progress and errors, and the catalog's entries. A switch is prepared
# here (the canonical message, with a fresh nonce, for one of the owner's devices, as the
# device authority lists them: ``model_settings.switch_signers``) and takes effect only with
# that device's signature over it (``model_settings.switch_model``).

@admin.register(ModelSelection)
class ModelSelectionAdmin(ReadOnlyOwnerAdmin):
    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if request.method == "POST":
            return self._post(request)
        cat = catalog.load_catalog()
        devices = model_settings.switch_signers().of_owner(request.user.pk)
        prepared = None
        if request.GET.get("prepare") and request.GET.get("device"):
            prepared = self._prepare(request, cat, devices)
        context = {
            **self.admin_site.each_context(request),
            "title": "Local models",
            "rows": model_settings.settings_overview(),
            "catalog_file": catalog.catalog_file(),
            "catalog_error": cat.error,
            "devices": devices,
            "prepared": prepared,
            "opts": self.model._meta,
            "recent_switches": ModelSwitch.objects.select_related("device").order_by("-created_at")[:10],
        }
        return TemplateResponse(request, "admin/llm/local_models.html", context)

    def _prepare(
        self, request: HttpRequest, cat: catalog.Catalog, devices: list[model_settings.SwitchSigner]
    ) -> dict[str, Any] | None:
        kind, _, key = str(request.GET["prepare"]).partition(":")
        model_id, _, version = key.partition("@")
        entry = cat.find(kind, model_id, version)
        wanted = str(uuid_or_nil(request.GET["device"]))
        device = next((d for d in devices if d.id == wanted), None)
        if entry is None or device is None:
            messages.error(request, "Choose a model from the catalog and one of your devices.")
            return None
        issued_at, nonce = int(time.time()), secrets.token_urlsafe(24)
        message = model_settings.model_switch_message(
            device.id, entry.kind, entry.id, entry.version, entry.digest_summary, issued_at, nonce
        )
        return {"kind": entry.kind, "model_id": entry.id, "version": entry.version, "device": device,
                "issued_at": issued_at, "nonce": nonce, "message": message.decode()}

    def _post(self, request: HttpRequest) -> HttpResponse:
        if not getattr(request.user, "is_owner", False):
            messages.error(request, "Only the owner can switch models.")
            return HttpResponseRedirect(request.path)
        try:
            switch = model_settings.SignedSwitch.from_payload(
                {name: request.POST.get(name, "") for name in ("device_id", "kind", "model_id", "version", "issued_at", "nonce", "signature")}
            )
            row = model_settings.switch_model(switch)
        except YimiError as exc:
            messages.error(request, f"The switch was refused ({exc.code}): {exc.message}")
        else:
            note = model_settings.STATE_NOTES.get(row.state, "")
            messages.success(request, f"{row.kind}: {row.selected_key} selected ({row.state}){' — ' + note if note else ''}.")
        return HttpResponseRedirect(request.path)


# --- model roles ---------------------------------------------------------------------------------
# The model roles page: ``/admin/llm/modelrole/``, in the same admin section as the
# local models page above.
#
# One row per role: provider, model, base URL, where the settings came from ("imported
# from the environment at first start on <date>", "set in the console", ...) and whether a
# key is set — never the key, which this page never decrypts. Read-only: changes are drafts
# confirmed on one of the owner's devices, and ``llm.roles.apply`` writes them (a backup's
# restore and a master key's rotation are ``llm.role_backup``'s).

@admin.register(ModelRole)
class ModelRoleAdmin(ReadOnlyOwnerAdmin):
    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        marker = roles.import_marker()
        context = {
            **self.admin_site.each_context(request),
            "title": "Model roles",
            "rows": roles.overview(),
            "marker": marker,
            "master_key_file": keyring.master_key_path().name,
            "fallback": roles.FALLBACK,
            "opts": self.model._meta,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/llm/model_roles.html", context)


# --- drafts of model role changes ----------------------------------------------------------------
# The model drafts page: ``/admin/llm/modelroledraft/``, in the same admin section as
# the model roles and the local models.
#
# The owner makes a draft here (role, provider, base URL, model, options, and optionally a
# new key in a password field that is never rendered back), sees its probe result and
# discards it. Confirming happens on a device: the page shows the digest and the exact
# message the device signs (``llm.role_drafts.draft_confirm_message``); nothing on this
# page applies a draft.

FORM_FIELDS = ("role", "provider", "base_url", "model", "thinking_field", "timeout_seconds", "connect_timeout_seconds", "max_tokens", "note")


def options_from_form(data: Any) -> dict[str, Any]:
    """The options fields of the form; empty ones are left to the defaults."""
    options: dict[str, Any] = {"thinking_field": str(data.get("thinking_field", "")).strip()}
    for name, kind in (("timeout_seconds", float), ("connect_timeout_seconds", float), ("max_tokens", int)):
        raw = str(data.get(name, "")).strip()
        if raw:
            try:
                options[name] = kind(raw)
            except ValueError:
                raise YimiError("invalid_model_settings", f"{name} must be a number") from None
    for name in ("include_usage", "estimate_usage"):
        options[name] = data.get(name) == "on"
    return options


@admin.register(ModelRoleDraft)
class ModelRoleDraftAdmin(ReadOnlyOwnerAdmin):
    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        form: dict[str, Any] = {"role": "brain", "include_usage": True}
        if request.method == "POST":
            response = self._post(request, form)
            if response is not None:
                return response
        selected = None
        if request.GET.get("draft"):
            selected = ModelRoleDraft.objects.filter(id=uuid_or_nil(request.GET["draft"])).first()
        context = {
            **self.admin_site.each_context(request),
            "title": "Model drafts",
            "drafts": [role_drafts.serialize_draft(d) for d in ModelRoleDraft.objects.order_by("-created_at")[:50]],
            "selected": role_drafts.serialize_draft(selected) if selected else None,
            "canonical": role_drafts.canonical_contents(selected.role, selected.provider, selected.base_url, selected.model,
                                                        selected.options, selected.key_change) if selected else "",
            "message_template": "\n".join([role_drafts.MESSAGE_VERSION, "<device id>", str(selected.id) if selected else "<draft id>",
                                           selected.digest if selected else "<digest>", "<issued_at: unix seconds>",
                                           "<nonce: 16-64 of A-Z a-z 0-9 _ ->", "unlocked", "<method: face_id | touch_id>"]),
            "form": form,
            "roles": roles.ROLES,
            "opts": self.model._meta,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/llm/model_drafts.html", context)

    def _post(self, request: HttpRequest, form: dict[str, Any]) -> HttpResponse | None:
        """Create, probe or discard; a refused form is shown again with what was typed,
        except the key."""
        action = request.POST.get("action")
        try:
            if action == "discard":
                draft = role_drafts.discard_draft(request.POST.get("draft_id"))
                messages.success(request, f"Draft {str(draft.id)[:8]} discarded.")
            elif action == "probe":
                draft = role_drafts.probe_draft(request.POST.get("draft_id"))
                messages.info(request, f"Draft {str(draft.id)[:8]} probed: {draft.probe_status}.")
            elif action == "create":
                form.update({name: request.POST.get(name, "") for name in FORM_FIELDS})
                form.update({name: request.POST.get(name) == "on" for name in ("include_usage", "estimate_usage")})
                draft, _ = role_drafts.create_draft(
                    str(request.POST.get("role", "")), provider=str(request.POST.get("provider", "")),
                    base_url=str(request.POST.get("base_url", "")), model=str(request.POST.get("model", "")),
                    options=options_from_form(request.POST), api_key=str(request.POST.get("api_key", "")) or None,
                    created_by="owner_console", note=str(request.POST.get("note", "")),
                )
                draft = role_drafts.probe_draft(draft.id)
                messages.success(request, f"Draft {str(draft.id)[:8]} made and probed ({draft.probe_status}). Confirm it on your phone or Mac.")
            else:
                messages.error(request, "Unknown action.")
                return HttpResponseRedirect(request.path)
        except YimiError as exc:
            messages.error(request, f"Refused ({exc.code}): {exc.message}")
            return None if action == "create" else HttpResponseRedirect(request.path)
        return HttpResponseRedirect(f"{request.path}?draft={draft.id}")


# --- model usage ---------------------------------------------------------------------------------
# The console's usage page, ``/admin/llm/modelusage/``: model calls by role and by day as
# a server-rendered SVG plot and a table, then the latest calls; and the inline that lists a
# run's model calls on its page. Read-only: ``llm.usage`` is the only writer.

DEFAULT_DAYS = 14


MAX_DAYS = 90


RECENT_CALLS = 50


@admin.register(ModelUsage)
class ModelUsageAdmin(ReadOnlyOwnerAdmin):
    list_display = ("created_at", "role", "provider", "model", "tokens", "cost_display", "duration_ms", "outcome", "run")
    readonly_fields = [f.name for f in ModelUsage._meta.fields]

    @admin.display(description="tokens")
    def tokens(self, obj: ModelUsage) -> str:
        return usage.tokens_text(obj)

    @admin.display(description="cost")
    def cost_display(self, obj: ModelUsage) -> str:
        return usage.cost_text(obj)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        days = DEFAULT_DAYS
        raw = request.GET.get("days")
        if raw is not None:
            if raw.isdigit() and 1 <= int(raw) <= MAX_DAYS:
                days = int(raw)
            else:
                messages.error(request, f"days must be a whole number from 1 to {MAX_DAYS}; showing {DEFAULT_DAYS}.")
        summary = usage.usage_summary(days)
        prices_error = ""
        try:
            priced = len(usage.load_prices())
        except YimiError as exc:
            priced, prices_error = 0, exc.message
        recent = list(self.get_queryset(request).select_related("run", "run__inbound")[:RECENT_CALLS])
        context = {
            **self.admin_site.each_context(request),
            "title": "Model usage",
            "opts": self.model._meta,
            "days": days,
            "plot": mark_safe(usage.usage_plot_svg(summary)),  # noqa: S308 - built by usage_plot_svg, every text escaped
            "rows": summary.rows,
            "totals": usage.by_role_totals(summary.rows).values(),
            "recent": [(row, usage.tokens_text(row), usage.cost_text(row)) for row in recent],
            "prices_file": usage.prices_file(),
            "priced_models": priced,
            "prices_error": prices_error,
        }
        return TemplateResponse(request, "admin/llm/model_usage.html", context)


class ModelUsageInline(ReadOnlyInline):
    """A run's model calls, on the run's page."""

    model = ModelUsage
    fk_name = "run"
    fields = ("created_at", "role", "provider", "model", "tokens", "cost_display", "duration_ms", "outcome", "agent_task")
    readonly_fields = fields
    ordering = ("created_at",)
    show_change_link = False
    verbose_name = "model call"
    verbose_name_plural = "model calls"

    @admin.display(description="tokens")
    def tokens(self, obj: ModelUsage) -> str:
        return usage.tokens_text(obj)

    @admin.display(description="cost")
    def cost_display(self, obj: ModelUsage) -> str:
        return usage.cost_text(obj)
