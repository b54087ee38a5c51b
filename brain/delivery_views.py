"""Internal endpoint of the ``delivery`` pack (``platform_api`` ``watches``), on the internal
listener with the pack capability of the call being executed (``yimi_project.internal``),
acting for the owner of the call only:

- ``POST watches/parcels/`` ``{"action": "list"}`` → ``{"parcels": [...]}`` (the followed ones);
- ``{"action": "follow", "tracking_number", "label"?, "state"?}`` → ``{"parcel", "created"}``;
- ``{"action": "unfollow", "tracking_number"}`` → ``{"stopped": [watch ids], "tracking_number"}``.

``follow`` and ``unfollow`` need a call the gateway decided as ``owner_data`` (asked on a
card unless the owner requested it) on the call's own ``tracking_number``
(``brain.deliveries``). Anything else is ``forbidden`` and changes nothing; errors are
``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import User
from brain import deliveries
from yimi_project.errors import YimiError
from yimi_project.internal import PackCall, json_object, pack_owner, require_call


class ParcelsView(APIView):
    authentication_classes: list = []
    permission_classes = [PackCall]
    platform_api = "watches"

    def post(self, request: Request) -> Response:
        owner, body = pack_owner(request), json_object(request)
        action = body.get("action", "list")
        if action == "list":
            return Response({"parcels": [deliveries.parcel_payload(w) for w in deliveries.followed(owner)]})
        if action not in ("follow", "unfollow"):
            raise YimiError("invalid_request", "action is list, follow or unfollow")
        number = deliveries.tracking_number(body.get("tracking_number"))
        require_call(request, ("owner_data",), tracking_number=number)
        if action == "unfollow":
            return Response({"stopped": deliveries.unfollow(owner, number), "tracking_number": number})
        watch, created = deliveries.follow(
            User.objects.get(id=owner), number, label=body.get("label"), known=body.get("state", ""),
            run_key=request.pack_call.get("run"),  # type: ignore[attr-defined]
        )
        return Response({"parcel": deliveries.parcel_payload(watch), "created": created})
