"""Admin login lockout (django-axes): which client address a failed login counts against.

The address is ``REMOTE_ADDR`` and nothing else: never ``X-Forwarded-For`` or any other
header a client can write. Behind a reverse proxy, the trusted-proxy middleware (first in
``MIDDLEWARE``) is the only code that may put the real client's address there.
"""

from __future__ import annotations

from django.http import HttpRequest


def client_address(request: HttpRequest) -> str | None:
    return request.META.get("REMOTE_ADDR") or None
