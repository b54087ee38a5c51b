from __future__ import annotations

from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.identity import instance_public_key_b64
from devices.services import PairingRequest, pair_device


class PairView(APIView):
    """POST /api/pair/: a new device presents a pairing code and its public key."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    def post(self, request: Request) -> Response:
        pairing = PairingRequest.from_payload(request.data)
        device = pair_device(pairing, client_ip=request.META.get("REMOTE_ADDR", "unknown"))
        return Response(
            {
                "device_id": str(device.id),
                "kind": device.kind,
                "name": device.name,
                "guest": device.is_guest,
                "instance_public_key": instance_public_key_b64(),
                "protocol": 1,
            },
            status=201,
        )
