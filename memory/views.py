from __future__ import annotations

from typing import Any
from uuid import UUID

from django.conf import settings
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.services import is_owner
from memory import assertions, preferences, recall, short_context
from memory.services import page_after, serialize_entry
from yimi_project.errors import YimiError


def _int_param(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name, str(default))
    try:
        return int(raw)
    except ValueError:
        raise YimiError("invalid_request", f"{name} must be an integer") from None


class TimelineView(APIView):
    """GET /api/timeline/?after=N&limit=M: the owner's timeline in pages (docs/protocol.md)."""

    def get(self, request: Request) -> Response:
        after = _int_param(request, "after", 0)
        limit = min(_int_param(request, "limit", 50), settings.TIMELINE_PAGE_MAX)
        device = getattr(request, "yimi_device", None)
        if device is None and not is_owner(request.user):
            raise YimiError("forbidden", "only the owner or a paired device reads the timeline")
        page = page_after(
            owner_id=request.user.pk,
            after=after,
            limit=limit,
            only_device_id=device.id if device is not None and device.is_guest else None,
        )
        return Response(
            {
                "after": page.after,
                "entries": [serialize_entry(e) for e in page.entries],
                "next_after": page.next_after,
                "has_more": page.has_more,
            }
        )


# --- L3, speaking preferences and recall (docs/memory.md) -----------------------------------------
# The same views serve the owner (``api/memory/...``, actor ``owner``) and, subclassed in
# ``memory.internal_views``, the memory pack over loopback (actor ``agent``).


class IsOwner(BasePermission):
    """The owner (``accounts.services.is_owner``), signed in or through one of their own
    (non-guest) devices; a device authenticates as its account, so another account's
    device — a second superuser's included — is refused like any other non-owner."""

    message = "only the owner reads and changes memory"

    def has_permission(self, request: Request, view: object) -> bool:
        device = getattr(request, "yimi_device", None)
        if device is not None and device.is_guest:
            return False
        return is_owner(request.user)


def _body(request: Request) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise YimiError("invalid_request", "expected a JSON object")
    return request.data


def _flag(request: Request, name: str) -> bool | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    return raw.lower() in ("1", "true", "yes")


class MemoryView(APIView):
    permission_classes = [IsOwner]
    actor = "owner"

    def owner_id(self, request: Request) -> int:
        return int(request.user.pk)


class AssertionsView(MemoryView):
    """GET: query current assertions; POST: commit a version (compare-and-set)."""

    def get(self, request: Request) -> Response:
        rows = assertions.query(
            self.owner_id(request),
            predicate=request.query_params.get("predicate") or None,
            prefix=request.query_params.get("prefix") or None,
            text=request.query_params.get("q") or None,
            needs_reevaluation=_flag(request, "needs_reevaluation"),
            include_forgotten=bool(_flag(request, "include_forgotten")),
            limit=min(_int_param(request, "limit", 50), 500),
        )
        return Response({"assertions": rows})

    def post(self, request: Request) -> Response:
        commit_request = assertions.CommitRequest.from_payload(self.owner_id(request), _body(request), actor=self.actor)
        result = assertions.commit(commit_request)
        return Response(result.payload(), status=200 if result.replayed else 201)


class AssertionView(MemoryView):
    def get(self, request: Request, pk: UUID) -> Response:
        return Response(assertions.get(self.owner_id(request), pk))


class AssertionHistoryView(MemoryView):
    def get(self, request: Request, pk: UUID) -> Response:
        return Response(assertions.history(self.owner_id(request), pk))


class ForgetView(MemoryView):
    """GET: what would be forgotten; POST ``{"request_id", "confirm": true}``: forget it."""

    require_confirm = True

    def get(self, request: Request, pk: UUID) -> Response:
        return Response(assertions.forget_preview(self.owner_id(request), pk).payload())

    def post(self, request: Request, pk: UUID) -> Response:
        body = _body(request)
        if self.require_confirm and body.get("confirm") is not True:
            raise YimiError("confirmation_required", "review GET .../forget/ first, then POST with \"confirm\": true")
        result = assertions.forget(self.owner_id(request), pk, request_id=str(body.get("request_id") or ""), actor=self.actor)
        return Response(result.payload())


class SpeakingPreferencesView(MemoryView):
    """GET: the current preferences; PUT/POST ``{"text", "expected_version", "request_id"}``."""

    def get(self, request: Request) -> Response:
        return Response(preferences.current(self.owner_id(request)))

    def put(self, request: Request) -> Response:
        body = _body(request)
        result = preferences.set_preferences(
            self.owner_id(request), body.get("text"), expected_version=_body_int(body, "expected_version"),
            request_id=str(body.get("request_id") or ""), actor=self.actor,
        )
        return Response(result.payload(), status=200 if result.replayed else 201)

    post = put


class RestorePreferencesView(MemoryView):
    """POST ``{"expected_version", "request_id"}``: the previous version becomes current again."""

    def post(self, request: Request) -> Response:
        body = _body(request)
        result = preferences.restore_previous(
            self.owner_id(request), expected_version=_body_int(body, "expected_version"),
            request_id=str(body.get("request_id") or ""), actor=self.actor,
        )
        return Response(result.payload(), status=200 if result.replayed else 201)


class RecallView(MemoryView):
    """GET ``?q=question[&layers=l3,timeline]``."""

    def get(self, request: Request) -> Response:
        question = request.query_params.get("q", "").strip()
        if not question:
            raise YimiError("invalid_request", "q (the question) is required")
        raw_layers = request.query_params.get("layers")
        layers = [x for x in raw_layers.split(",") if x] if raw_layers else None
        if layers and set(layers) - {"l3", "timeline", "l5"}:
            raise YimiError("invalid_request", "layers are l3, timeline and l5")
        result = recall.recall(self.owner_id(request), question[:500], layers=layers, limit=min(_int_param(request, "limit", 10), 50))
        return Response(result.payload())


class ShortContextView(MemoryView):
    def get(self, request: Request) -> Response:
        return Response(short_context.call_short_context(self.owner_id(request)).payload())


def _body_int(body: dict[str, Any], name: str) -> int:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise YimiError("invalid_request", f"{name} must be an integer")
    return value
