from __future__ import annotations

from django.conf import settings
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from memory.services import page_after, serialize_entry
from yimi_project.errors import YimiError


def _int_param(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name, str(default))
    try:
        return int(raw)
    except ValueError:
        raise YimiError("invalid_request", f"{name} must be an integer") from None


class TimelineView(APIView):
    """GET /api/timeline/?after=N&limit=M: the owner's timeline in pages (docs/protocol.md)."""

    def get(self, request: Request) -> Response:
        after = _int_param(request, "after", 0)
        limit = min(_int_param(request, "limit", 50), settings.TIMELINE_PAGE_MAX)
        device = getattr(request, "yimi_device", None)
        if device is None and not getattr(request.user, "is_owner", False):
            raise YimiError("forbidden", "only the owner or a paired device reads the timeline")
        page = page_after(
            owner_id=request.user.pk,
            after=after,
            limit=limit,
            only_device_id=device.id if device is not None and device.is_guest else None,
        )
        return Response(
            {
                "after": page.after,
                "entries": [serialize_entry(e) for e in page.entries],
                "next_after": page.next_after,
                "has_more": page.has_more,
            }
        )
