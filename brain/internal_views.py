"""Internal reminder endpoints for the ``schedule`` pack (internal listener + a pack capability).

    GET  internal/reminders/?include_done=1      → 200 {"reminders": [...]}
    POST internal/reminders/                     → 201 {"reminder": {...}, "created": true}
         {"text", "due_at", "idempotency_key"?}     (200 and "created": false for a replay)
    POST internal/reminders/<uuid>/cancel/       → 200 {"reminder": {...}}

They act for the owner of the call the pack is executing (its capability, see
``yimi_project.call_capability``): listing needs a capability for a call of the schedule
pack; creating and cancelling need a call the gateway decided as ``owner_data``, and a
cancel must be on the call's own ``reminder_id``. Errors are ``{"error": {"code",
"message"}}`` (``yimi_project.api``).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import User
from brain import reminders
from yimi_project.errors import YimiError
from yimi_project.internal import PackCall, require_call


def _owner(request: Request) -> Any:
    owner = User.objects.filter(pk=request.pack_call.get("owner")).first()  # type: ignore[attr-defined]
    if owner is None:
        raise YimiError("no_owner", "this call has no owner on this instance (run manage.py yimi_init)")
    return owner


class InternalView(APIView):
    authentication_classes: list = []
    permission_classes = [PackCall]
    platform_api = "reminders"


class RemindersView(InternalView):
    def get(self, request: Request) -> Response:
        include_done = request.query_params.get("include_done", "").lower() in ("1", "true", "yes")
        rows = reminders.list_reminders(_owner(request), include_done=include_done)
        return Response({"reminders": [reminders.serialize_reminder(r) for r in rows]})

    def post(self, request: Request) -> Response:
        data = request.data
        if not isinstance(data, dict):
            raise YimiError("invalid_request", "expected a JSON object")
        require_call(request, ("owner_data",))
        reminder, created = reminders.create_reminder(
            _owner(request), data.get("text"), data.get("due_at"), idempotency_key=data.get("idempotency_key")
        )
        return Response({"reminder": reminders.serialize_reminder(reminder), "created": created}, status=201 if created else 200)


class CancelReminderView(InternalView):
    def post(self, request: Request, pk: UUID) -> Response:
        require_call(request, ("owner_data",), reminder_id=pk)
        reminder = reminders.cancel_reminder(_owner(request), pk)
        return Response({"reminder": reminders.serialize_reminder(reminder)})
