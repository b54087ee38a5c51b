"""The gateway's three interfaces over loopback HTTP (internal token required)."""

from __future__ import annotations

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from capabilities import services
from yimi_project.errors import YimiError
from yimi_project.internal import LoopbackWithInternalToken


class _Internal(APIView):
    authentication_classes: list = []
    permission_classes = [LoopbackWithInternalToken]


def _body(request: Request) -> dict:
    if not isinstance(request.data, dict):
        raise YimiError("invalid_request", "expected a JSON object")
    return request.data


class DecideView(_Internal):
    def post(self, request: Request) -> Response:
        decision = services.decide(services.CallRequest.from_payload(_body(request)))
        return Response(decision.payload())


class ReceiptView(_Internal):
    def post(self, request: Request) -> Response:
        data = _body(request)
        error = data.get("transport_error")
        outcome = services.record_receipt(
            data.get("call_id"), data.get("result"), transport_error=str(error) if error else None
        )
        return Response(outcome.payload())


class ObserveView(_Internal):
    def post(self, request: Request) -> Response:
        data = _body(request)
        services.observe(data.get("call_id"), duration_ms=data.get("duration_ms"), error=data.get("error", ""))
        return Response({"ok": True})
