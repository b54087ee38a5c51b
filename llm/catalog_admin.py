"""The settings page for local models: ``/admin/llm/modelselection/``.

For each kind it shows the selected, effective and previous versions, what the switch
is waiting for, progress and errors, and the catalog's entries. A switch is prepared
here (the canonical message, with a fresh nonce, for one of the owner's devices, as the
device authority lists them: ``model_settings.switch_signers``) and takes effect only with
that device's signature over it (``model_settings.switch_model``).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from accounts.owner_admin import OwnerContentAdmin
from llm import catalog, model_settings
from llm.models import ModelSelection, ModelSwitch
from yimi_project.errors import YimiError
from yimi_project.ids import uuid_or_nil


@admin.register(ModelSelection)
class ModelSelectionAdmin(OwnerContentAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

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
