"""Images on the device protocol (docs/protocol.md "Images"): the bytes over signed HTTP,
the announcement as an ``image`` frame on ``/ws/device/``.

Why two steps: a websocket message is limited to 64 KiB (and 1 MiB at the transport), a
photo is up to 4 MiB. ``POST /api/images/`` carries the raw JPEG or PNG bytes, signed like
every device request (``yimi-http-v2``: the body's SHA-256 is in the signature), and
answers ``image_id``; the ``image`` frame then puts it on the timeline with its capture
time and the request it is about. The storage and every check are ``memory.personal.images``.
The faces analyzer (``voice.faces``) is registered with ``memory.personal.images`` by the voice app.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import Device, Scope
from accounts.services import device_scope_limit
from memory.personal import images
from yimi_project.api_schema import responses
from yimi_project.errors import YimiError

UPLOAD_ERRORS = ("image_too_large", "image_unsupported", "image_too_many_pixels", "image_invalid", "storage_full",
                 "not_authenticated", "request_replayed", "forbidden")


def device_scope(device: Device) -> str:
    """The scope the device's images are kept under: ``guest`` for a guest device (or any
    account but the owner's), ``owner`` otherwise (``accounts.services.device_scope_limit``)."""
    limit = device_scope_limit(device)
    return str(limit[0]) if limit else str(Scope.OWNER)


class UploadedBody(serializers.Serializer):  # type: ignore[type-arg]
    image_id = serializers.UUIDField(help_text="name it in the image frame within 10 minutes")
    content_type = serializers.ChoiceField(choices=["image/jpeg", "image/png"])
    width = serializers.IntegerField()
    height = serializers.IntegerField()
    size_bytes = serializers.IntegerField()
    sha256 = serializers.CharField()


class ImageUploadView(APIView):
    """POST /api/images/: the raw bytes of one JPEG or PNG image from a paired device."""

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        """Read the body before authentication checks its signature; a body larger than
        ``IMAGE_MAX_BYTES`` never gets here: ``yimi_project.infra.body_limit`` refuses it
        (``image_too_large``) before Django spools it, and this check is the second line."""
        declared = request.META.get("CONTENT_LENGTH") or "0"
        if declared.isdigit() and int(declared) > settings.IMAGE_MAX_BYTES:
            raise YimiError("image_too_large", f"an image is limited to {settings.IMAGE_MAX_BYTES} bytes",
                            limit=settings.IMAGE_MAX_BYTES)
        raw = request._request
        if not hasattr(raw, "_body"):
            data = raw.read(settings.IMAGE_MAX_BYTES + 1)
            if len(data) > settings.IMAGE_MAX_BYTES:
                raise YimiError("image_too_large", f"an image is limited to {settings.IMAGE_MAX_BYTES} bytes",
                                limit=settings.IMAGE_MAX_BYTES)
            raw._body = data
        super().initial(request, *args, **kwargs)

    @extend_schema(
        operation_id="upload_image", request={"image/jpeg": bytes, "image/png": bytes},
        responses=responses({201: UploadedBody}, *UPLOAD_ERRORS),
        examples=[OpenApiExample("stored", value={"image_id": "…", "content_type": "image/jpeg", "width": 1280, "height": 720,
                                                  "size_bytes": 183211, "sha256": "…"}, response_only=True)],
    )
    def post(self, request: Request) -> Response:
        device = getattr(request, "yimi_device", None)
        if device is None:
            raise YimiError("forbidden", "images are uploaded by a paired device (signed request)")
        image = images.store_upload(device=device, scope=device_scope(device), data=request.body)
        return Response(
            {"image_id": str(image.id), "content_type": image.content_type, "width": image.width, "height": image.height,
             "size_bytes": image.size_bytes, "sha256": image.sha256},
            status=201,
        )


# --- the image frame ---------------------------------------------------------------------------

MAX_CLIENT_SKEW_SECONDS = 24 * 3600  # a capture time more than a day in the future is refused


def _captured_at(value: Any, now: datetime) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise YimiError("invalid_frame", "captured_at must be unix seconds (a number)")
    try:
        when = datetime.fromtimestamp(float(value), tz=UTC)
    except (OverflowError, OSError, ValueError):
        raise YimiError("invalid_frame", "captured_at is out of range") from None
    if (when - now).total_seconds() > MAX_CLIENT_SKEW_SECONDS:
        raise YimiError("invalid_frame", "captured_at is in the future")
    return when


def attach_from_frame(device: Device, frame: dict[str, Any], *, now: datetime | None = None) -> images.AttachedImage:
    """Parse an ``image`` frame and attach its upload (``memory.personal.images.attach_image``)."""
    now = now or datetime.now(tz=UTC)
    client_id, image_id, about, keep = frame.get("id"), frame.get("image_id"), frame.get("about"), frame.get("keep")
    if not isinstance(client_id, str) or not 1 <= len(client_id) <= 64:
        raise YimiError("invalid_frame", "image frames need an id of 1 to 64 characters")
    if not isinstance(image_id, str):
        raise YimiError("invalid_frame", "image_id must be the id POST /api/images/ answered")
    if about is not None and (not isinstance(about, str) or not 1 <= len(about) <= 64):
        raise YimiError("invalid_frame", "about must be the id (1 to 64 characters) of a text or voice request")
    if keep is not None and not isinstance(keep, bool):
        raise YimiError("invalid_frame", "keep must be true or false")
    return images.attach_image(
        device=device, scope=device_scope(device), image_id=image_id, client_id=client_id,
        captured_at=_captured_at(frame.get("captured_at"), now), about_client_id=about or "", keep=keep, now=now,
    )
