"""The HTTP API's OpenAPI 3 schema (``/api/schema/``) and its browsable page
(``/api/docs/``, Swagger UI served from the drf-spectacular-sidecar package's static files,
so nothing is fetched from a CDN).

Owner only, like the rest of the owner console: a signed-in account that is not the owner
gets 403, an anonymous visitor the admin login. The protocol itself is public
(docs/protocol.md), but a personal instance has one audience for its API surface — its
owner, writing a client — and nobody else gains from being shown it.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import AllowAny

from accounts.owner_admin import owner_only_view

API_PREFIX = "/api/"


def public_api_only(endpoints: list[tuple[str, str, str, Any]]) -> list[tuple[str, str, str, Any]]:
    """drf-spectacular preprocessing hook: describe /api/ only (not /internal/)."""
    return [e for e in endpoints if e[0].startswith(API_PREFIX)]


class DeviceSignatureScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """How the schema names the devices' request signatures (named by path: accounts sits
    below devices)."""

    target_class = "accounts.authentication.DeviceSignatureAuthentication"
    name = "deviceSignature"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "X-Yimi-Signature",
            "description": "Ed25519 signature of a paired device, sent with X-Yimi-Device, X-Yimi-Timestamp "
            "and X-Yimi-Nonce: docs/protocol.md, \"HTTP API for devices\".",
        }


def _owner_page(view: Any) -> Any:
    return login_required(owner_only_view(view), login_url="admin:login")


# The guard is the owner check above; DRF's own permission would answer an anonymous
# browser with 403 instead of the login page.
schema_view = _owner_page(SpectacularAPIView.as_view(permission_classes=[AllowAny]))
docs_view = _owner_page(SpectacularSwaggerView.as_view(url_name="api-schema", permission_classes=[AllowAny]))
