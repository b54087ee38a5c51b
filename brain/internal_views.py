"""Internal reminder endpoints for the ``schedule`` pack (loopback + internal token only).

    GET  internal/reminders/?include_done=1      → 200 {"reminders": [...]}
    POST internal/reminders/                     → 201 {"reminder": {...}, "created": true}
         {"text", "due_at", "idempotency_key"?}     (200 and "created": false for a replay)
    POST internal/reminders/<uuid>/cancel/       → 200 {"reminder": {...}}

The platform has one owner, so the endpoints act for ``accounts.services.get_owner()``.
Errors are ``{"error": {"code", "message"}}`` (``yimi_project.api``).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from brain import reminders
from yimi_project.errors import YimiError
from yimi_project.internal import LoopbackWithInternalToken


def _owner() -> Any:
    from accounts.services import get_owner

    owner = get_owner()
    if owner is None:
        raise YimiError("no_owner", "this instance has no owner yet (run manage.py yimi_init)")
    return owner


class InternalView(APIView):
    authentication_classes: list = []
    permission_classes = [LoopbackWithInternalToken]


class RemindersView(InternalView):
    def get(self, request: Request) -> Response:
        include_done = request.query_params.get("include_done", "").lower() in ("1", "true", "yes")
        rows = reminders.list_reminders(_owner(), include_done=include_done)
        return Response({"reminders": [reminders.serialize_reminder(r) for r in rows]})

    def post(self, request: Request) -> Response:
        data = request.data
        if not isinstance(data, dict):
            raise YimiError("invalid_request", "expected a JSON object")
        reminder, created = reminders.create_reminder(
            _owner(), data.get("text"), data.get("due_at"), idempotency_key=data.get("idempotency_key")
        )
        return Response({"reminder": reminders.serialize_reminder(reminder), "created": created}, status=201 if created else 200)


class CancelReminderView(InternalView):
    def post(self, request: Request, pk: UUID) -> Response:
        reminder = reminders.cancel_reminder(_owner(), pk)
        return Response({"reminder": reminders.serialize_reminder(reminder)})
