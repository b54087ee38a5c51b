from __future__ import annotations

from typing import Any
from uuid import UUID

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.services import is_owner
from memory import api_schema as bodies
from memory import recall, short_context
from memory.assertions import preferences
from memory.assertions import store as assertions
from memory.timeline.entries import page_after, serialize_entry
from yimi_project.api_schema import PARSE_ERRORS, responses
from yimi_project.errors import YimiError


def _int_param(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name, str(default))
    try:
        return int(raw)
    except ValueError:
        raise YimiError("invalid_request", f"{name} must be an integer") from None


class TimelineView(APIView):
    """GET /api/timeline/?after=N&limit=M: the owner's timeline in pages (docs/protocol.md)."""

    @extend_schema(
        operation_id="timeline_page", parameters=bodies.TIMELINE_PARAMETERS,
        responses=responses({200: bodies.TimelinePage}, "invalid_request", *bodies.AUTH_ERRORS),
    )
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

    @extend_schema(
        operation_id="memory_assertions_query", parameters=bodies.ASSERTION_QUERY_PARAMETERS,
        responses=responses({200: bodies.AssertionList}, "invalid_request", *bodies.AUTH_ERRORS),
    )
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

    @extend_schema(
        operation_id="memory_assertions_commit", request=bodies.CommitBody,
        responses=responses({201: bodies.CommitResultBody, 200: bodies.CommitResultBody}, *bodies.WRITE_ERRORS),
        description="Commit a new version on top of expected_version (compare-and-set). 201 committed; 200 the same "
        "request_id and body again (replayed, nothing new).",
    )
    def post(self, request: Request) -> Response:
        commit_request = assertions.CommitRequest.from_payload(self.owner_id(request), _body(request), actor=self.actor)
        result = assertions.commit(commit_request)
        return Response(result.payload(), status=200 if result.replayed else 201)


class AssertionView(MemoryView):
    @extend_schema(operation_id="memory_assertion_get", responses=responses({200: bodies.AssertionBody}, *bodies.READ_ERRORS))
    def get(self, request: Request, pk: UUID) -> Response:
        return Response(assertions.get(self.owner_id(request), pk))


class AssertionHistoryView(MemoryView):
    @extend_schema(operation_id="memory_assertion_history", responses=responses({200: bodies.HistoryBody}, *bodies.READ_ERRORS))
    def get(self, request: Request, pk: UUID) -> Response:
        return Response(assertions.history(self.owner_id(request), pk))


class ForgetView(MemoryView):
    """GET: what would be forgotten; POST ``{"request_id", "confirm": true}``: forget it."""

    require_confirm = True

    @extend_schema(operation_id="memory_assertion_forget_preview", responses=responses({200: bodies.ForgetPreviewBody}, *bodies.READ_ERRORS))
    def get(self, request: Request, pk: UUID) -> Response:
        return Response(assertions.forget_preview(self.owner_id(request), pk).payload())

    @extend_schema(
        operation_id="memory_assertion_forget", request=bodies.ForgetBody,
        responses=responses({200: bodies.ForgetResultBody}, *bodies.AUTH_ERRORS, *PARSE_ERRORS, "not_found",
                            "confirmation_required", "forget_incomplete"),
    )
    def post(self, request: Request, pk: UUID) -> Response:
        body = _body(request)
        if self.require_confirm and body.get("confirm") is not True:
            raise YimiError("confirmation_required", "review GET .../forget/ first, then POST with \"confirm\": true")
        result = assertions.forget(self.owner_id(request), pk, request_id=str(body.get("request_id") or ""), actor=self.actor)
        return Response(result.payload())


class SpeakingPreferencesView(MemoryView):
    """GET: the current preferences; PUT/POST ``{"text", "expected_version", "request_id"}``."""

    @extend_schema(operation_id="memory_speaking_preferences_get", responses=responses({200: bodies.SpeakingPreferencesBody}, *bodies.AUTH_ERRORS))
    def get(self, request: Request) -> Response:
        return Response(preferences.current(self.owner_id(request)))

    @extend_schema(
        operation_id="memory_speaking_preferences_set", request=bodies.SetPreferencesBody,
        responses=responses({201: bodies.CommitResultBody, 200: bodies.CommitResultBody}, *bodies.PREFERENCE_ERRORS),
    )
    def put(self, request: Request) -> Response:
        body = _body(request)
        result = preferences.set_preferences(
            self.owner_id(request), body.get("text"), expected_version=_body_int(body, "expected_version"),
            request_id=str(body.get("request_id") or ""), actor=self.actor,
        )
        return Response(result.payload(), status=200 if result.replayed else 201)

    @extend_schema(
        operation_id="memory_speaking_preferences_set_by_post", request=bodies.SetPreferencesBody,
        responses=responses({201: bodies.CommitResultBody, 200: bodies.CommitResultBody}, *bodies.PREFERENCE_ERRORS),
        description="The same as PUT, for clients that only POST.",
    )
    def post(self, request: Request) -> Response:
        return self.put(request)


class RestorePreferencesView(MemoryView):
    """POST ``{"expected_version", "request_id"}``: the previous version becomes current again."""

    @extend_schema(
        operation_id="memory_speaking_preferences_restore", request=bodies.RestorePreferencesBody,
        responses=responses({201: bodies.CommitResultBody, 200: bodies.CommitResultBody}, *bodies.PREFERENCE_ERRORS, "nothing_to_restore"),
    )
    def post(self, request: Request) -> Response:
        body = _body(request)
        result = preferences.restore_previous(
            self.owner_id(request), expected_version=_body_int(body, "expected_version"),
            request_id=str(body.get("request_id") or ""), actor=self.actor,
        )
        return Response(result.payload(), status=200 if result.replayed else 201)


class RecallView(MemoryView):
    """GET ``?q=question[&layers=l3,timeline]``."""

    @extend_schema(
        operation_id="memory_recall", parameters=bodies.RECALL_PARAMETERS,
        responses=responses({200: bodies.RecallBody}, "invalid_request", *bodies.AUTH_ERRORS),
    )
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
    @extend_schema(operation_id="memory_short_context", responses=responses({200: bodies.ShortContextBody}, *bodies.AUTH_ERRORS))
    def get(self, request: Request) -> Response:
        return Response(short_context.call_short_context(self.owner_id(request)).payload())


def _body_int(body: dict[str, Any], name: str) -> int:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise YimiError("invalid_request", f"{name} must be an integer")
    return value
