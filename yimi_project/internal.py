"""Internal HTTP endpoints: loopback only, and only with the instance's internal token.

Used by the capability gateway's three interfaces and by packs calling back into the
platform. A request from any other address, or without the token, is refused with
``forbidden`` and changes nothing.
"""

from __future__ import annotations

import hmac
import ipaddress

from django.conf import settings
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

TOKEN_HEADER = "X-Yimi-Internal-Token"


def is_loopback(address: str | None) -> bool:
    try:
        return ipaddress.ip_address(address or "").is_loopback
    except ValueError:
        return False


class LoopbackWithInternalToken(BasePermission):
    message = "internal endpoints answer loopback requests carrying the internal token only"

    def has_permission(self, request: Request, view: object) -> bool:
        token = request.headers.get(TOKEN_HEADER, "")
        return is_loopback(request.META.get("REMOTE_ADDR")) and hmac.compare_digest(token, settings.INTERNAL_TOKEN)
