"""Internal endpoint for the ``health`` pack (``platform_api`` ``health``), on the internal
listener with the pack capability of the call being executed (``yimi_project.internal``):

- ``POST read/`` (``after``?, ``before``?, ``kind``?, ``limit``? ≤ 100) — the owner's
  health records starting in [after, before), newest first (``memory.personal.health.read``).

Reading only: records are written by the owner's devices (``health.record`` frames), never
by a pack. Errors are ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from memory.personal import health
from yimi_project.internal import PackCall, json_object, pack_owner


class ReadView(APIView):
    authentication_classes: list = []
    permission_classes = [PackCall]
    platform_api = "health"

    def post(self, request: Request) -> Response:
        owner, body = pack_owner(request), json_object(request)
        rows = health.read(owner, after=body.get("after"), before=body.get("before"), kind=body.get("kind"), limit=body.get("limit", 50))
        return Response({"records": [health.record_payload(r) for r in rows], "count": len(rows)})
