"""Internal endpoints for the ``release`` pack (``platform_api`` ``releases``), on the
internal listener with the pack capability of the call being executed
(``yimi_project.internal``):

- ``POST rollback/`` (``reason``: the owner's words) — only the ``release__rollback`` call
  the gateway decided as ``self_change`` (the owner asked): queues the request
  (``releases.requested.request_rollback``);
- ``POST status/`` (optional ``request_id``) — any such call: the owner's latest request,
  or that one.

They act for the owner of the call only. Errors are ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import User
from releases import requested
from releases.request_models import RollbackRequest
from yimi_project.errors import YimiError
from yimi_project.ids import uuid_or_nil
from yimi_project.internal import PackCall, json_object, pack_owner, require_call


def request_payload(request: RollbackRequest) -> dict[str, Any]:
    return {
        "request_id": str(request.id), "state": request.state, "reason": request.reason, "from_build": request.from_build,
        "to_build": request.to_build, "state_reason": request.state_reason, "requested_at": request.requested_at.isoformat(),
        "decided_at": request.decided_at.isoformat() if request.decided_at else None,
    }


class ReleasesView(APIView):
    authentication_classes: list = []
    permission_classes = [PackCall]
    platform_api = "releases"


class RollbackView(ReleasesView):
    def post(self, request: Request) -> Response:
        body = json_object(request)
        require_call(request, ("self_change",), tools=("release__rollback",))
        owner = User.objects.get(pk=pack_owner(request))
        reason = body.get("reason")
        if not isinstance(reason, str):
            raise YimiError("invalid_request", "reason (the owner's words) is a string")
        return Response(request_payload(requested.request_rollback(owner, reason)))


class StatusView(ReleasesView):
    def post(self, request: Request) -> Response:
        body = json_object(request)
        rows = RollbackRequest.objects.filter(owner_id=pack_owner(request))
        if body.get("request_id"):
            rows = rows.filter(id=uuid_or_nil(body["request_id"]))
        found = rows.order_by("-requested_at").first()
        if found is None:
            raise YimiError("not_found", "there is no such rollback request")
        return Response(request_payload(found))
