from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.devices import MAX_CAPTURE_CHANNELS, PairingRequest, pair_device
from accounts.identity import instance_public_key_b64
from accounts.models import Device
from yimi_project.api_schema import PARSE_ERRORS, responses


class PairBody(serializers.Serializer):  # type: ignore[type-arg]
    """``PairingRequest`` as the schema shows it (docs/protocol.md, "Pairing"); the service parses."""

    code = serializers.CharField(help_text="the pairing code, e.g. ABCD-EFGH (dashes, spaces and case ignored)")
    kind = serializers.ChoiceField(choices=Device.Kind.values)
    name = serializers.CharField(min_length=1, max_length=64, help_text="a taken name becomes 'name 2', 'name 3', …")
    capture_channels = serializers.ListField(
        child=serializers.RegexField(r"^[a-z][a-z0-9_]*$"), max_length=MAX_CAPTURE_CHANNELS, required=False
    )
    public_key = serializers.CharField(help_text="base64 of the device's raw 32-byte Ed25519 public key")
    signature = serializers.CharField(help_text="base64 Ed25519 signature of 'yimi-pair-v1\\n{CODE}\\n{public_key}'")
    relay_via = serializers.UUIDField(required=False, allow_null=True, help_text="a watch: the owner's phone it relays through")


class PairedBody(serializers.Serializer):  # type: ignore[type-arg]
    device_id = serializers.UUIDField()
    kind = serializers.ChoiceField(choices=Device.Kind.values)
    name = serializers.CharField(help_text="the name the device was given")
    guest = serializers.BooleanField()
    instance_public_key = serializers.CharField(help_text="base64 Ed25519 key the device checks the server with")
    protocol = serializers.IntegerField(help_text="1")


class PairView(APIView):
    """POST /api/pair/: a new device presents a pairing code and its public key."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(
        operation_id="pair_device", request=PairBody, auth=[],
        responses=responses({201: PairedBody}, *PARSE_ERRORS, "invalid_public_key", "bad_signature", "invalid_code",
                            "code_used", "code_expired", "rate_limited"),
    )
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
