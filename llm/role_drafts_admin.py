"""The model drafts page: ``/admin/llm/modelroledraft/``, in the same admin section as
the model roles and the local models.

The owner makes a draft here (role, provider, base URL, model, options, and optionally a
new key in a password field that is never rendered back), sees its probe result and
discards it. Confirming happens on a device: the page shows the digest and the exact
message the device signs (``llm.role_drafts.draft_confirm_message``); nothing on this
page applies a draft.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from accounts.owner_admin import OwnerContentAdmin
from llm import role_drafts, roles
from llm.role_draft_models import ModelRoleDraft
from yimi_project.errors import YimiError
from yimi_project.ids import uuid_or_nil

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
class ModelRoleDraftAdmin(OwnerContentAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

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
