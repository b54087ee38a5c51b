"""The model roles page: ``/admin/llm/modelrole/``, in the same admin section as the
local models (``catalog_admin``).

One row per role: provider, model, base URL, where the settings came from ("imported
from the environment at first start on <date>", "set in the console", ...) and whether a
key is set — never the key, which this page never decrypts. Read-only: changes are drafts
confirmed on one of the owner's devices, and ``llm.roles.apply`` writes them (a backup's
restore and a master key's rotation are ``llm.role_backup``'s).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from accounts.owner_admin import OwnerContentAdmin
from llm import keyring, roles
from llm.role_models import ModelRole


@admin.register(ModelRole)
class ModelRoleAdmin(OwnerContentAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

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
