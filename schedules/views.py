"""Internal endpoints of the packs whose platform side is this app, on the internal listener
with the pack capability of the call being executed (``yimi_project.internal``), acting for
the owner of the call only. Anything else is ``forbidden`` and changes nothing; errors are
``{"error": {"code", "message"}}`` (``yimi_project.api``). Routes: ``schedules/urls.py``.

The ``schedule`` pack (``platform_api`` ``reminders``):

    GET  internal/reminders/?include_done=1      → 200 {"reminders": [...]}
    POST internal/reminders/                     → 201 {"reminder": {...}, "created": true}
         {"text", "due_at", "idempotency_key"?}     (200 and "created": false for a replay)
    POST internal/reminders/<uuid>/cancel/       → 200 {"reminder": {...}}

Listing needs a capability for a call of the schedule pack; creating and cancelling need a
call the gateway decided as ``owner_data``, and a cancel must be on the call's own
``reminder_id`` (``schedules.reminders``).

The ``location`` pack (``platform_api`` ``location``), under ``internal/location/``:

- ``POST where/`` (``place``?) — the latest report, the places it is inside, and for
  ``place`` its state (inside / outside / null when unknown) and distance;
- ``POST places/`` (``action`` list | set | remove) — ``set`` and ``remove`` need a call
  the gateway decided as ``owner_data`` (asked on a card unless the owner requested it) on
  the call's own ``name``;
- ``POST distance/`` (``from``, ``to``: a place, coordinates or ``here``);
- ``POST geofences/`` (``action`` create | list | cancel) — ``create`` and ``cancel`` need
  an ``owner_data`` call on the call's own ``place`` / ``watch_id`` (``schedules.geofences``).

Reports and places are memory's (``memory.personal.location``); geofences are this app's watches.

The ``delivery`` pack (``platform_api`` ``watches``):

- ``POST watches/parcels/`` ``{"action": "list"}`` → ``{"parcels": [...]}`` (the followed ones);
- ``{"action": "follow", "tracking_number", "label"?, "state"?}`` → ``{"parcel", "created"}``;
- ``{"action": "unfollow", "tracking_number"}`` → ``{"stopped": [watch ids], "tracking_number"}``.

``follow`` and ``unfollow`` need a call the gateway decided as ``owner_data`` (asked on a
card unless the owner requested it) on the call's own ``tracking_number``
(``schedules.parcels``).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import User
from memory.personal import location
from schedules import geofences, parcels, reminders
from yimi_project.errors import YimiError
from yimi_project.internal import PackCall, json_object, pack_owner, require_call

# --- the schedule pack: reminders -----------------------------------------------------------


def _owner(request: Request) -> Any:
    owner = User.objects.filter(pk=request.pack_call.get("owner")).first()  # type: ignore[attr-defined]
    if owner is None:
        raise YimiError("no_owner", "this call has no owner on this instance (run manage.py yimi_init)")
    return owner


class InternalView(APIView):
    authentication_classes: list = []
    permission_classes = [PackCall]
    platform_api = "reminders"


class RemindersView(InternalView):
    def get(self, request: Request) -> Response:
        include_done = request.query_params.get("include_done", "").lower() in ("1", "true", "yes")
        rows = reminders.list_reminders(_owner(request), include_done=include_done)
        return Response({"reminders": [reminders.serialize_reminder(r) for r in rows]})

    def post(self, request: Request) -> Response:
        data = request.data
        if not isinstance(data, dict):
            raise YimiError("invalid_request", "expected a JSON object")
        require_call(request, ("owner_data",))
        reminder, created = reminders.create_reminder(
            _owner(request), data.get("text"), data.get("due_at"), idempotency_key=data.get("idempotency_key")
        )
        return Response({"reminder": reminders.serialize_reminder(reminder), "created": created}, status=201 if created else 200)


class CancelReminderView(InternalView):
    def post(self, request: Request, pk: UUID) -> Response:
        require_call(request, ("owner_data",), reminder_id=pk)
        reminder = reminders.cancel_reminder(_owner(request), pk)
        return Response({"reminder": reminders.serialize_reminder(reminder)})


# --- the location pack: where, places, distance, geofences ----------------------------------


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


# --- the delivery pack: followed parcels -----------------------------------------------------


class ParcelsView(APIView):
    authentication_classes: list = []
    permission_classes = [PackCall]
    platform_api = "watches"

    def post(self, request: Request) -> Response:
        owner, body = pack_owner(request), json_object(request)
        action = body.get("action", "list")
        if action == "list":
            return Response({"parcels": [parcels.parcel_payload(w) for w in parcels.followed(owner)]})
        if action not in ("follow", "unfollow"):
            raise YimiError("invalid_request", "action is list, follow or unfollow")
        number = parcels.tracking_number(body.get("tracking_number"))
        require_call(request, ("owner_data",), tracking_number=number)
        if action == "unfollow":
            return Response({"stopped": parcels.unfollow(owner, number), "tracking_number": number})
        watch, created = parcels.follow(
            User.objects.get(id=owner), number, label=body.get("label"), known=body.get("state", ""),
            run_key=request.pack_call.get("run"),  # type: ignore[attr-defined]
        )
        return Response({"parcel": parcels.parcel_payload(watch), "created": created})
