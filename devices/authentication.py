"""DRF authentication for devices: every request signed with the device key.

Headers: ``X-Yimi-Device`` (device id), ``X-Yimi-Timestamp`` (unix seconds, within
±300 s) and ``X-Yimi-Signature`` over ``yimi-http-v1\\nMETHOD\\nPATH\\nTS\\nsha256(body)``.
"""

from __future__ import annotations

import time

from django.conf import settings
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from devices import signatures
from devices.services import active_device
from yimi_project.errors import YimiError


class DeviceSignatureAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request):  # type: ignore[no-untyped-def]
        device_id = request.headers.get("X-Yimi-Device")
        if not device_id:
            return None
        ts = request.headers.get("X-Yimi-Timestamp", "")
        sig = request.headers.get("X-Yimi-Signature", "")
        try:
            skew = abs(time.time() - int(ts))
        except ValueError:
            raise exceptions.AuthenticationFailed("X-Yimi-Timestamp must be unix seconds") from None
        if skew > settings.HTTP_SIGNATURE_MAX_SKEW_SECONDS:
            raise exceptions.AuthenticationFailed("request timestamp is too far from the server clock")
        try:
            device = active_device(device_id)
        except YimiError as exc:
            raise exceptions.AuthenticationFailed(exc.message) from None
        message = signatures.http_message(request.method or "GET", request.get_full_path(), ts, request.body)
        if not signatures.verify(device.public_key, message, sig):
            raise exceptions.AuthenticationFailed("bad request signature")
        request._request.yimi_device = device  # type: ignore[attr-defined]
        request.yimi_device = device  # type: ignore[attr-defined]
        return (device.owner, device)

    def authenticate_header(self, request: Request) -> str:
        return "YimiDevice"
