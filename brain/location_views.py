"""Internal endpoints for the ``location`` pack (``platform_api`` ``location``), on the
internal listener with the pack capability of the call being executed
(``yimi_project.internal``), acting for the owner of the call only:

- ``POST where/`` (``place``?) — the latest report, the places it is inside, and for
  ``place`` its state (inside / outside / null when unknown) and distance;
- ``POST places/`` (``action`` list | set | remove) — ``set`` and ``remove`` need a call
  the gateway decided as ``owner_data`` (asked on a card unless the owner requested it) on
  the call's own ``name``;
- ``POST distance/`` (``from``, ``to``: a place, coordinates or ``here``);
- ``POST geofences/`` (``action`` create | list | cancel) — ``create`` and ``cancel`` need
  an ``owner_data`` call on the call's own ``place`` / ``watch_id`` (``brain.geofences``).

Anything else is ``forbidden`` and changes nothing; errors are ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import User
from brain import geofences
from memory.personal import location
from yimi_project.errors import YimiError
from yimi_project.internal import PackCall, json_object, pack_owner, require_call


class LocationView(APIView):
    authentication_classes: list = []
    permission_classes = [PackCall]
    platform_api = "location"


class WhereView(LocationView):
    def post(self, request: Request) -> Response:
        owner, body = pack_owner(request), json_object(request)
        report = location.latest_report(owner)
        answer: dict[str, Any] = {
            "report": location.report_payload(report) if report else None,
            "inside": location.places_inside(owner, report),
        }
        if body.get("place") is not None:
            place = location.get_place(owner, body["place"])
            answer["place"] = {
                "name": place.name, "state": location.place_state(place, report),
                "distance_m": round(location.haversine_m(report.lat, report.lon, place.lat, place.lon)) if report else None,
            }
        return Response(answer)


class PlacesView(LocationView):
    def post(self, request: Request) -> Response:
        owner, body = pack_owner(request), json_object(request)
        action = body.get("action", "list")
        if action == "list":
            return Response({"places": [location.place_payload(p) for p in location.list_places(owner)]})
        if action not in ("set", "remove"):
            raise YimiError("invalid_request", "action is list, set or remove")
        require_call(request, ("owner_data",), tools=("location__places",), name=body.get("name"))
        if action == "set":
            here = body.get("here", False)
            if not isinstance(here, bool):
                raise YimiError("invalid_request", "here is true or false")
            place, created = location.set_place(
                owner, body.get("name"), lat=body.get("lat"), lon=body.get("lon"), radius_m=body.get("radius_m"), here=here
            )
            return Response({"place": location.place_payload(place), "created": created})
        removed = location.remove_place(owner, body.get("name"))
        return Response({"removed": removed.name})


class DistanceView(LocationView):
    def post(self, request: Request) -> Response:
        body = json_object(request)
        return Response(location.distance(pack_owner(request), body.get("from"), body.get("to")))


class GeofencesView(LocationView):
    def post(self, request: Request) -> Response:
        owner, body = pack_owner(request), json_object(request)
        action = body.get("action", "list")
        if action == "list":
            return Response({"geofences": [geofences.geofence_payload(w) for w in geofences.active_geofences(owner)]})
        if action == "create":
            require_call(request, ("owner_data",), tools=("location__notify_arrival",), place=body.get("place"))
            watch = geofences.create_geofence(
                User.objects.get(id=owner), body.get("place"), repeat=body.get("repeat", False),
                run_key=request.pack_call.get("run"),  # type: ignore[attr-defined]
            )
            return Response({"geofence": geofences.geofence_payload(watch)})
        if action == "cancel":
            require_call(request, ("owner_data",), tools=("location__geofences",), watch_id=body.get("watch_id"))
            return Response({"cancelled": geofences.cancel_geofence(owner, body.get("watch_id")), "watch_id": str(body.get("watch_id"))})
        raise YimiError("invalid_request", "action is create, list or cancel")
