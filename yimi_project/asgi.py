"""ASGI entry point: HTTP through Django, websockets through Channels (served by daphne)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yimi_project.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from devices.routing import websocket_urlpatterns  # noqa: E402
from yimi_project.infra import websocket_transport  # noqa: E402
from yimi_project.infra.body_limit import BodyLimit  # noqa: E402
from yimi_project.internal import InternalJsonEndpoints  # noqa: E402

# Oversized messages close with 1009, and 1013 can be sent (yimi_project/infra/websocket_transport.py).
websocket_transport.install()

application = ProtocolTypeRouter(
    {
        # The gateway's internal JSON endpoints skip Django's middleware on the internal
        # socket (yimi_project/internal.py, InternalJsonEndpoints); all else is Django's.
        # Bodies beyond their path's limit are refused before Django spools them to disk.
        "http": BodyLimit(InternalJsonEndpoints(django_asgi_app)),
        # Devices are native clients without a browser Origin; they authenticate by signing
        # a server nonce with their device key (docs/protocol.md), not by cookie or Origin.
        "websocket": URLRouter(websocket_urlpatterns),
    }
)

