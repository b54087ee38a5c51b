"""Internal endpoints for the ``erasure`` pack (``platform_api`` ``erasure``), on the internal
listener with the pack capability of the call being executed (``yimi_project.internal``):

- ``POST preview/`` (criteria) — any executing call of the ``erasure`` pack (the only pack
  the API serves, ``yimi_project.internal.API_PACKS``);
- ``POST erase/`` (``preview_token``) — only a call the gateway decided as ``delete`` (asked on
  a card unless the owner requested it), on the call's own ``preview_token``;
- ``POST result/`` (``erasure_id`` or ``preview_token``) — any such call.

They act for the owner of the call only (``memory.timeline.erasure``). Anything else is ``forbidden``
and changes nothing; errors are ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from memory.timeline import erasure
from yimi_project.internal import PackCall, json_object, pack_owner, require_call


class ErasureView(APIView):
    authentication_classes: list = []
    permission_classes = [PackCall]
    platform_api = "erasure"


class PreviewView(ErasureView):
    def post(self, request: Request) -> Response:
        return Response(erasure.preview(pack_owner(request), json_object(request)).payload())


class EraseView(ErasureView):
    def post(self, request: Request) -> Response:
        body = json_object(request)
        require_call(request, ("delete",), preview_token=body.get("preview_token"))
        return Response(erasure.erase(pack_owner(request), body.get("preview_token")))


class ResultView(ErasureView):
    def post(self, request: Request) -> Response:
        body = json_object(request)
        return Response(erasure.result(pack_owner(request), erasure=body.get("erasure_id"), token=body.get("preview_token")))
