"""The location pack: where the owner is, their named places, distances and "when I get
home" geofences, through the platform.

The platform (``memory.personal.location`` for reports and places, ``schedules.geofences`` for the
watches) is the only authority; this server calls ``/internal/location/...`` on the
platform socket with the capability of the call it is executing. Writes (setting or
removing a place, creating or cancelling a geofence) need a call the gateway decided as
``owner_data`` on the same name / place / watch. A connection that fails during a write is
``unknown`` (check with ``places`` / ``geofences`` list). The fake (``fake/tools.py``) runs
these same handlers against an in-memory platform.
"""

from __future__ import annotations

from typing import Any

from capabilities.packkit import PlatformLost, PlatformNotConfigured, ToolRegistry, effect, platform_call, receipt, value

TOOLS = ToolRegistry()
SOURCE = "yimi location"

POINT = {
    "description": 'a place {"place": name}, coordinates {"lat", "lon"}, or "here" (the latest report)',
    "oneOf": [
        {"type": "string", "enum": ["here"]},
        {"type": "object", "properties": {"place": {"type": "string", "maxLength": 64}}, "required": ["place"]},
        {"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90},
                                          "lon": {"type": "number", "minimum": -180, "maximum": 180}}, "required": ["lat", "lon"]},
    ],
}
WHERE_SCHEMA = {"type": "object", "properties": {"place": {"type": "string", "minLength": 1, "maxLength": 64, "description": "also say whether the owner is at this place"}}}
PLACES_SCHEMA = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": ["list", "set", "remove"]},
        "name": {"type": "string", "minLength": 1, "maxLength": 64, "description": "the place's name, e.g. 家"},
        "lat": {"type": "number", "minimum": -90, "maximum": 90},
        "lon": {"type": "number", "minimum": -180, "maximum": 180},
        "here": {"type": "boolean", "description": "set the place at the owner's latest reported location"},
        "radius_m": {"type": "number", "minimum": 20, "maximum": 50000, "description": "metres (default 150)"},
    },
    "required": ["action"],
}
DISTANCE_SCHEMA = {"type": "object", "properties": {"from": POINT, "to": POINT}, "required": ["from", "to"]}
ARRIVAL_SCHEMA = {
    "type": "object",
    "properties": {
        "place": {"type": "string", "minLength": 1, "maxLength": 64, "description": "a named place (see places)"},
        "repeat": {"type": "boolean", "description": "notify at every arrival (default: once, at the next arrival)"},
    },
    "required": ["place"],
}
GEOFENCES_SCHEMA = {
    "type": "object",
    "properties": {"action": {"type": "string", "enum": ["list", "cancel"]}, "watch_id": {"type": "string", "maxLength": 64}},
    "required": ["action"],
}


def call(path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """One request to ``/internal/location/<path>``: (HTTP status, parsed JSON or None)."""
    return platform_call("POST", "location/" + path, body)


def refuse(code: str, message: str, *, retry: str = "forbidden") -> dict[str, Any]:
    return receipt("failed", summary=message, retry=retry, error=(code, message[:1000]))


def failure(status: int, payload: Any, *, changes: bool, check_with: str) -> dict[str, Any]:
    error = payload.get("error") if isinstance(payload, dict) else None
    code = str(error.get("code")) if isinstance(error, dict) and error.get("code") else f"http_{status}"
    message = str(error.get("message", "")) if isinstance(error, dict) else f"the platform answered HTTP {status}"
    if status >= 500 and changes:
        return receipt("unknown", summary=f"the platform failed during the change (HTTP {status})", unknowns=["whether it changed"],
                       retry="after_check", check_with=check_with, error=(code, message[:1000]))
    return refuse(code, message or code, retry="allowed" if status >= 500 or status == 429 else "forbidden")


def ask(path: str, body: dict[str, Any], *, changes: bool = False, check_with: str = "where", expect: str = "") -> dict[str, Any]:
    """Call the platform; a dict payload on 200, else the failed/unknown receipt (key ``_receipt``)."""
    try:
        status, payload = call(path, body)
    except PlatformNotConfigured as exc:
        return {"_receipt": refuse("not_configured", str(exc))}
    except PlatformLost as exc:
        if changes:
            return {"_receipt": receipt("unknown", summary=str(exc), unknowns=["whether it changed"], retry="after_check",
                                        check_with=check_with, error=(exc.code, str(exc)))}
        return {"_receipt": receipt("unknown", summary=str(exc), unknowns=["the answer"], retry="allowed", error=(exc.code, str(exc)))}
    if status != 200 or not isinstance(payload, dict) or (expect and expect not in payload):
        return {"_receipt": failure(status, payload, changes=changes, check_with=check_with)}
    return payload


@TOOLS("Where the owner is: the latest location report from their phone (coordinates, accuracy, time), the named places it is inside, and optionally whether they are at one place.", WHERE_SCHEMA)
def where(args: dict[str, Any]) -> dict[str, Any]:
    body = {"place": args["place"]} if isinstance(args.get("place"), str) else {}
    answer = ask("where/", body, expect="report")
    if "_receipt" in answer:
        return answer["_receipt"]
    report, inside = answer["report"], answer.get("inside", [])
    place = answer.get("place")
    values = [value("places_inside", len(inside), "place", SOURCE)]
    if report is None:
        summary = "no location report has arrived from the owner's phone yet"
    else:
        summary = f"last reported at {report['at']} (±{report['accuracy_m']:g} m)" + (f", at {', '.join(inside)}" if inside else "")
        values += [value("accuracy", report["accuracy_m"], "m", SOURCE)]
    if place is not None:
        summary += f"; {place['name']}: {place['state'] or 'unknown'}"
        if place.get("distance_m") is not None:
            values.append(value("distance_to_place", place["distance_m"], "m", SOURCE))
    return receipt("succeeded", summary=summary, values=values, content={"report": report, "inside": inside, "place": place})


@TOOLS("The owner's named places: list them, set one (by coordinates or here = the latest reported location; radius in metres) or remove one.", PLACES_SCHEMA)
def places(args: dict[str, Any]) -> dict[str, Any]:
    action = args.get("action")
    if action == "list":
        answer = ask("places/", {"action": "list"}, expect="places")
        if "_receipt" in answer:
            return answer["_receipt"]
        items = answer["places"]
        return receipt("succeeded", summary=f"{len(items)} named places", values=[value("places", len(items), "place", SOURCE)],
                       content={"items": items})
    if action not in ("set", "remove"):
        return refuse("invalid_request", "action is list, set or remove")
    if not isinstance(args.get("name"), str) or not args["name"].strip():
        return refuse("invalid_request", "set and remove need the place's name")
    body = {k: args[k] for k in ("name", "lat", "lon", "here", "radius_m") if k in args}
    answer = ask("places/", {"action": action, **body}, changes=True, check_with="places")
    if "_receipt" in answer:
        return answer["_receipt"]
    if action == "remove":
        return receipt("succeeded", summary=f"removed the place {answer['removed']}",
                       effects=[effect(f"place:{answer['removed']}", "delete", "service_ack")], content={"removed": answer["removed"]},
                       retry="forbidden")
    place = answer["place"]
    verb = "created" if answer.get("created") else "updated"
    return receipt("succeeded", summary=f"{verb} the place {place['name']} ({place['radius_m']:g} m)",
                   effects=[effect(f"place:{place['name']}", "create" if answer.get("created") else "update", "service_ack")],
                   values=[value("radius", place["radius_m"], "m", SOURCE)], content={"place": place})


@TOOLS("The great-circle distance between two points: named places, coordinates, or here (the owner's latest reported location).", DISTANCE_SCHEMA)
def distance(args: dict[str, Any]) -> dict[str, Any]:
    if "from" not in args or "to" not in args:
        return refuse("invalid_request", "distance needs from and to")
    answer = ask("distance/", {"from": args["from"], "to": args["to"]}, expect="distance_m")
    if "_receipt" in answer:
        return answer["_receipt"]
    metres = answer["distance_m"]
    return receipt("succeeded", summary=f"{answer['from']} to {answer['to']}: {metres / 1000:.1f} km",
                   values=[value("distance", metres, "m", SOURCE)], content=answer)


@TOOLS("Notify the owner when they arrive at a named place (\"when I get home, remind me\"): a geofence watch, once at the next arrival, or at every arrival with repeat.", ARRIVAL_SCHEMA)
def notify_arrival(args: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(args.get("place"), str) or not args["place"].strip():
        return refuse("invalid_request", "notify_arrival needs a place")
    body: dict[str, Any] = {"action": "create", "place": args["place"]}
    if "repeat" in args:
        body["repeat"] = args["repeat"]
    answer = ask("geofences/", body, changes=True, check_with="geofences", expect="geofence")
    if "_receipt" in answer:
        return answer["_receipt"]
    fence = answer["geofence"]
    when = "at every arrival" if fence["repeat"] else "at the next arrival"
    return receipt("succeeded", summary=f"will notify {when} at {fence['place']}",
                   effects=[effect(f"watch:{fence['watch_id']}", "create", "service_ack")], content={"geofence": fence}, retry="forbidden")


@TOOLS("The owner's active arrival notifications (geofences): list them, or cancel one by watch_id.", GEOFENCES_SCHEMA)
def geofences(args: dict[str, Any]) -> dict[str, Any]:
    action = args.get("action")
    if action == "list":
        answer = ask("geofences/", {"action": "list"}, expect="geofences")
        if "_receipt" in answer:
            return answer["_receipt"]
        items = answer["geofences"]
        return receipt("succeeded", summary=f"{len(items)} active geofences", values=[value("geofences", len(items), "geofence", SOURCE)],
                       content={"items": items})
    if action != "cancel":
        return refuse("invalid_request", "action is list or cancel")
    if not isinstance(args.get("watch_id"), str) or not args["watch_id"]:
        return refuse("invalid_request", "cancel needs the watch_id")
    answer = ask("geofences/", {"action": "cancel", "watch_id": args["watch_id"]}, changes=True, check_with="geofences", expect="cancelled")
    if "_receipt" in answer:
        return answer["_receipt"]
    if not answer["cancelled"]:
        return receipt("succeeded", summary="this geofence had already ended", values=[value("cancelled", False, None, SOURCE)],
                       content={"watch_id": args["watch_id"]})
    return receipt("succeeded", summary="cancelled the geofence", effects=[effect(f"watch:{args['watch_id']}", "cancel", "service_ack")],
                   values=[value("cancelled", True, None, SOURCE)], content={"watch_id": args["watch_id"]}, retry="forbidden")
