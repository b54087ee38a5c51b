"""The owner's memory in the admin: assertions with their full history and dependencies,
edits (a new version through ``memory.assertions.store.commit``), forgetting with a preview of
everything that will be forgotten, and the list of what needs re-evaluation. Only the
owner sees memory; nothing here writes a table directly."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.defaultfilters import pluralize
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.dateparse import parse_datetime

from accounts.owner_admin import OwnerContentAdmin, clip
from accounts.services import is_owner
from memory.assertions import preferences
from memory.assertions import store as assertions
from memory.assertions.models import Assertion
from yimi_project.errors import YimiError


def _text_shaped(payload: Any) -> bool:
    """A payload the owner edits as text: a string, or an object whose only free-text field
    is ``text`` (plus ``doc`` for core profile entries)."""
    return isinstance(payload, str) or (isinstance(payload, dict) and isinstance(payload.get("text"), str) and set(payload) <= {"text", "doc"})


def _posted_payload(request: HttpRequest, current: Any) -> Any:
    """The new payload from the edit form: the text field (and ``doc``), or, for a payload
    that is not text-shaped, the JSON field. Raises ValueError on bad JSON."""
    if "text" not in request.POST:
        return json.loads(request.POST.get("payload", ""))
    text = request.POST["text"].replace("\r\n", "\n").strip()
    if isinstance(current, str):
        return text
    payload: dict[str, Any] = {"text": text}
    if isinstance(current, dict) and "doc" in current or request.POST.get("doc"):
        payload["doc"] = request.POST.get("doc") or (current or {}).get("doc", "memory")
    return payload


def _is_owner(request: HttpRequest) -> bool:
    return is_owner(request.user)


@admin.register(Assertion)
class AssertionAdmin(OwnerContentAdmin):
    list_display = ("short_id", "predicate", "current_version", "state", "needs_reevaluation", "short_summary", "updated_at")
    list_filter = ("state", "needs_reevaluation", "predicate")
    search_fields = ("summary", "predicate")
    ordering = ("-updated_at",)
    change_list_template = "admin/memory/assertion/change_list.html"

    @admin.display(description="id")
    def short_id(self, obj: Assertion) -> str:
        return str(obj.id)[:8]

    @admin.display(description="summary")
    def short_summary(self, obj: Assertion) -> str:
        return clip(obj.summary) if obj.state == Assertion.State.ACTIVE else "(forgotten)"

    # Only the owner reads memory (OwnerContentAdmin); rows change only through the services.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).filter(owner_id=request.user.pk)

    def get_urls(self) -> list[Any]:
        wrap = self.admin_site.admin_view
        return [
            path("needs-reevaluation/", wrap(self.reevaluation_view), name="memory_assertion_reevaluation"),
            path("speaking-preferences/", wrap(self.speaking_view), name="memory_assertion_speaking"),
            path("<uuid:pk>/forget/", wrap(self.forget_view), name="memory_assertion_forget"),
            *super().get_urls(),
        ]

    def _assertion(self, request: HttpRequest, pk: Any) -> Assertion:
        if not _is_owner(request):
            raise PermissionError
        return get_object_or_404(Assertion, pk=pk, owner_id=request.user.pk)

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None) -> HttpResponse:
        """The assertion with every version and its dependencies; POST commits an edit as a
        new version (compare-and-set on the version the owner saw)."""
        if not _is_owner(request):
            return HttpResponse(status=403)
        try:
            pk = uuid.UUID(object_id)
        except ValueError:
            return HttpResponse(status=404)
        assertion = self._assertion(request, pk)
        history = assertions.history(request.user.pk, assertion.id)
        current = next((v for v in history["versions"] if v["version"] == assertion.current_version), None)
        current_payload = current["payload"] if current is not None else None
        text_form = _text_shaped(current_payload)
        if request.method == "POST":
            expected_raw = request.POST.get("expected_version", "")
            try:
                payload = _posted_payload(request, current_payload)
                expected = int(expected_raw)
                if assertion.predicate == assertions.SPEAKING_PREFERENCES:
                    result = preferences.set_preferences(
                        request.user.pk, payload.get("text", "") if isinstance(payload, dict) else payload,
                        expected_version=expected, request_id=f"admin-{uuid.uuid4().hex}", actor="owner",
                    )
                else:
                    result = assertions.commit(
                        assertions.CommitRequest(
                            owner_id=request.user.pk, request_id=f"admin-{uuid.uuid4().hex}", predicate=assertion.predicate,
                            payload=payload, expected_version=expected, assertion_id=assertion.id, actor="owner",
                        )
                    )
            except ValueError:
                messages.error(request, "The payload must be valid JSON and the version a number; nothing was changed.")
            except YimiError as exc:
                if exc.code == "conflict":
                    messages.error(
                        request,
                        f"Not saved (conflict): this assertion changed while you were editing — you edited version "
                        f"{expected_raw}, it is now at version {assertion.current_version}. Your text is below; "
                        "read the history and save again.",
                    )
                else:
                    messages.error(request, f"Not saved ({exc.code}): {exc.message}")
            else:
                note = f" {len(result.marked_for_reevaluation)} assertions concluded from it now need re-evaluation." if result.marked_for_reevaluation else ""
                messages.success(request, f"Saved as version {result.version}.{note}")
                return HttpResponseRedirect(request.path)
            shown = {"text": request.POST.get("text", ""), "doc": request.POST.get("doc", ""), "payload": request.POST.get("payload", "")}
        else:
            shown = {
                "text": assertions.payload_text(current_payload) if text_form and current_payload is not None else "",
                "doc": current_payload.get("doc", "memory") if isinstance(current_payload, dict) else "",
                "payload": json.dumps(current_payload, ensure_ascii=False, indent=2) if current_payload is not None else "",
            }
        names = {
            str(a.id): a
            for a in Assertion.objects.filter(
                id__in={d["assertion_id"] for v in history["versions"] for d in v["depends_on"]} | {d["assertion_id"] for d in history["dependents"]}
            )
        }
        for ref in [*history["dependents"], *(d for v in history["versions"] for d in v["depends_on"])]:
            other = names.get(ref["assertion_id"])
            ref["predicate"] = other.predicate if other is not None else "?"
        for v in history["versions"]:  # as the owner reads them: the text (or JSON), a date
            v["shown"] = assertions.payload_text(v["payload"]) if _text_shaped(v["payload"]) else json.dumps(v["payload"], ensure_ascii=False)
            v["committed"] = parse_datetime(v["committed_at"])
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"{assertion.predicate} · {str(assertion.id)[:8]}",
            "assertion": assertion,
            "history": history,
            "versions": list(reversed(history["versions"])),
            "shown": shown,
            "text_form": text_form,
            "is_core_profile": assertion.predicate == assertions.CORE_PROFILE,
            "core_docs": assertions.CORE_DOCS,
            "editable": assertion.state == Assertion.State.ACTIVE,
        }
        return TemplateResponse(request, "admin/memory/assertion/detail.html", context)

    def forget_view(self, request: HttpRequest, pk: uuid.UUID) -> HttpResponse:
        """GET: everything that will be forgotten; POST with ``confirm``: forget it."""
        if not _is_owner(request):
            return HttpResponse(status=403)
        assertion = self._assertion(request, pk)
        if request.method == "POST" and request.POST.get("confirm") == "yes":
            try:
                result = assertions.forget(request.user.pk, assertion.id, request_id=f"admin-forget-{uuid.uuid4().hex}", actor="owner")
            except YimiError as exc:
                messages.error(request, f"Nothing was forgotten ({exc.code}): {exc.message}")
                return HttpResponseRedirect(request.path)
            messages.success(
                request,
                f"Forgot {len(result.forgotten)} assertion{pluralize(len(result.forgotten))}; the payloads of "
                f"{result.versions_erased} version{pluralize(result.versions_erased)} were erased. "
                f"Not erased: {'; '.join(assertions.NOT_ERASED)}.",
            )
            return HttpResponseRedirect(reverse("admin:memory_assertion_changelist"))
        preview = assertions.forget_preview(request.user.pk, assertion.id)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Forget {assertion.predicate} · {str(assertion.id)[:8]}?",
            "assertion": assertion,
            "preview": preview,
            "not_erased": assertions.NOT_ERASED,
        }
        return TemplateResponse(request, "admin/memory/assertion/forget.html", context)

    def reevaluation_view(self, request: HttpRequest) -> HttpResponse:
        if not _is_owner(request):
            return HttpResponse(status=403)
        rows = Assertion.objects.filter(owner_id=request.user.pk, state=Assertion.State.ACTIVE, needs_reevaluation=True).order_by("-marked_at")
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Assertions that need re-evaluation",
            "rows": rows,
        }
        return TemplateResponse(request, "admin/memory/assertion/reevaluation.html", context)

    def speaking_view(self, request: HttpRequest) -> HttpResponse:
        """How Yimi speaks to the owner: the current text with every version; POST saves a
        new version (``preferences.set_preferences``) or restores the previous one
        (``preferences.restore_previous``), both compare-and-set on the version shown."""
        if not _is_owner(request):
            return HttpResponse(status=403)
        if request.method == "POST":
            request_id = f"admin-speaking-{uuid.uuid4().hex}"
            try:
                expected = int(request.POST.get("expected_version", ""))
                if request.POST.get("restore") == "yes":
                    result = preferences.restore_previous(request.user.pk, expected_version=expected, request_id=request_id)
                else:
                    text = request.POST.get("text", "").replace("\r\n", "\n").strip()
                    result = preferences.set_preferences(request.user.pk, text, expected_version=expected, request_id=request_id)
            except ValueError:
                messages.error(request, "Nothing was changed: the form is stale; reload the page.")
            except YimiError as exc:
                if exc.code == "conflict":
                    messages.error(request, "Not saved (conflict): the speaking preferences changed while you were editing; read them again.")
                else:
                    messages.error(request, f"Not saved ({exc.code}): {exc.message}")
            else:
                messages.success(request, f"Speaking preferences saved as version {result.version}.")
            return HttpResponseRedirect(request.path)
        now = preferences.current(request.user.pk)
        versions: list[dict[str, Any]] = []
        if now["assertion_id"] is not None:
            versions = list(reversed(assertions.history(request.user.pk, uuid.UUID(now["assertion_id"]))["versions"]))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Speaking preferences",
            "current": now,
            "versions": versions,
        }
        return TemplateResponse(request, "admin/memory/assertion/speaking.html", context)
