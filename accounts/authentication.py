"""DRF authentication for devices: every request signed with the device key.

Headers: ``X-Yimi-Device`` (device id), ``X-Yimi-Timestamp`` (unix seconds, within
±300 s), ``X-Yimi-Nonce`` (fresh per request) and ``X-Yimi-Signature`` over
``signatures.http_message`` (method, Host, path with query, timestamp, nonce, sha256(body)).
A nonce is remembered until its request's timestamp leaves the window, so a captured
request cannot be sent again (``request_replayed``), nor to another host.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from django.conf import settings
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from accounts import signatures
from accounts.devices import accept_request_nonce, active_device
from yimi_project.errors import YimiError


class DeviceSignatureAuthentication(authentication.BaseAuthentication):
    clock: Callable[[], float] = staticmethod(time.time)

    def authenticate(self, request: Request):  # type: ignore[no-untyped-def]
        device_id = request.headers.get("X-Yimi-Device")
        if not device_id:
            return None
        ts = request.headers.get("X-Yimi-Timestamp", "")
        nonce = request.headers.get("X-Yimi-Nonce", "")
        sig = request.headers.get("X-Yimi-Signature", "")
        if not (ts.isascii() and ts.isdigit()):
            raise exceptions.AuthenticationFailed("X-Yimi-Timestamp must be unix seconds")
        if abs(self.clock() - int(ts)) > settings.HTTP_SIGNATURE_MAX_SKEW_SECONDS:
            raise exceptions.AuthenticationFailed("request timestamp is too far from the server clock")
        if not signatures.HTTP_NONCE.fullmatch(nonce):
            raise exceptions.AuthenticationFailed("X-Yimi-Nonce must be 16 to 64 characters of A-Z, a-z, 0-9, - and _")
        try:
            device = active_device(device_id)
        except YimiError as exc:
            raise exceptions.AuthenticationFailed(exc.message) from None
        message = signatures.http_message(
            request.method or "GET", request.get_host(), request.get_full_path(), ts, nonce, request.body
        )
        if not signatures.verify(device.public_key, message, sig):
            raise exceptions.AuthenticationFailed("bad request signature")
        # Raises request_replayed for a nonce this device already used.
        accept_request_nonce(device, nonce, int(ts), now=datetime.fromtimestamp(self.clock(), tz=UTC))
        request._request.yimi_device = device  # type: ignore[attr-defined]
        request.yimi_device = device  # type: ignore[attr-defined]
        return (device.owner, device)

    def authenticate_header(self, request: Request) -> str:
        return "YimiDevice"
