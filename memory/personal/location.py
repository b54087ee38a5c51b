"""Where the owner is: the only code that writes ``LocationReport`` and ``Place``.

**Reports.** A ``location.report`` frame (docs/protocol.md, "Location and health") comes
from the owner's own phone over ``/ws/device/`` (``devices.consumers``) and is stored by
``record_report``. Steps: 1. the device is one of the owner's own, not a guest's
(``forbidden``), and a phone (``forbidden``); 2. the fields are in range (``invalid_frame``):
``id`` 1-64 characters, ``lat`` in [-90, 90], ``lon`` in [-180, 180], ``accuracy_m`` in
(0, 10,000], ``at`` ISO 8601 with a time zone, not more than 5 minutes ahead of the
server's clock nor older than 7 days; 3. the signature (``bad_signature``) over
``report_message`` — the numbers as the fixed-point text the message gives them, so a
phone in any language signs the same bytes; 4. the row, rounded as signed; a resend of
the same ``id`` from the same device returns the stored row (``duplicate``). Anything
refused stores nothing.

**Places.** Named circles (``set_place``/``remove_place``/``list_places``): a name of 1-64
characters, a centre in range, a radius of 20 m to 50 km; at most ``MAX_PLACES`` per owner.
A place may be set at the latest report (``here``).

**Inside or outside.** ``place_state`` says whether a report is inside a place's circle
(great-circle distance ≤ radius) — or ``None`` when the report's accuracy radius is larger
than the place's, which is too coarse to tell; geofences (``schedules.geofences``) then change
nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from accounts.services import device_scope_limit
from memory.personal.models import LocationReport, Place
from yimi_project.errors import YimiError

EARTH_RADIUS_M = 6_371_008.8  # the mean Earth radius (IUGG), metres
MAX_ACCURACY_M = 10_000.0
MAX_FUTURE = timedelta(minutes=5)
MAX_AGE = timedelta(days=7)
MIN_RADIUS_M, MAX_RADIUS_M, DEFAULT_RADIUS_M = 20.0, 50_000.0, 150.0
MAX_PLACES = 200
MAX_NAME = 64
REPORT_KINDS = ("phone",)


def haversine_m(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """The great-circle distance between two WGS 84 points in metres, on a sphere of the
    mean Earth radius (error under 0.5 % against the ellipsoid)."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_M * math.asin(min(1.0, math.sqrt(a)))


def report_message(device_id: str, nonce: str, frame_id: str, lat: float, lon: float, accuracy_m: float, at: str) -> bytes:
    """What the phone signs for one report: ``yimi-location-v1``, the device id, this
    connection's challenge nonce, the frame id, latitude and longitude with 7 decimals,
    the accuracy with 1 decimal, and ``at`` exactly as sent, joined by ``\\n``."""
    return f"yimi-location-v1\n{device_id}\n{nonce}\n{frame_id}\n{lat:.7f}\n{lon:.7f}\n{accuracy_m:.1f}\n{at}".encode()


def _number(value: Any, name: str, low: float, high: float, *, code: str = "invalid_frame", open_low: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise YimiError(code, f"{name} must be a number")
    try:
        number = float(value)  # an integer too large for a float overflows here
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise YimiError(code, f"{name} must be a finite number")
    if number > high or number < low or (open_low and number == low):
        raise YimiError(code, f"{name} must be {'above' if open_low else 'at least'} {low:g} and at most {high:g}")
    return number


def coordinates(lat: Any, lon: Any, *, code: str = "invalid_frame") -> tuple[float, float]:
    return _number(lat, "lat", -90.0, 90.0, code=code), _number(lon, "lon", -180.0, 180.0, code=code)


def parse_instant(value: Any, name: str, *, code: str = "invalid_frame") -> datetime:
    parsed = parse_datetime(value) if isinstance(value, str) and len(value) <= 64 else None
    if parsed is None or parsed.tzinfo is None:
        raise YimiError(code, f"{name} must be an ISO 8601 time with a time zone")
    return parsed


@dataclass(frozen=True)
class RecordedReport:
    report: LocationReport
    duplicate: bool


def record_report(device: Any, nonce: str, frame: dict[str, Any], *, now: datetime | None = None) -> RecordedReport:
    """Store one signed ``location.report`` of ``device`` (the steps are in the module's docstring)."""
    now = now or timezone.now()
    if device_scope_limit(device) is not None:
        raise YimiError("forbidden", "only the owner's own devices report the owner's location")
    if device.kind not in REPORT_KINDS:
        raise YimiError("forbidden", "location reports come from the owner's phone")
    frame_id = frame.get("id")
    if not isinstance(frame_id, str) or not 1 <= len(frame_id) <= 64:
        raise YimiError("invalid_frame", "a location report needs an id of 1 to 64 characters")
    lat, lon = coordinates(frame.get("lat"), frame.get("lon"))
    accuracy = _number(frame.get("accuracy_m"), "accuracy_m", 0.0, MAX_ACCURACY_M, open_low=True)
    at = parse_instant(frame.get("at"), "at")
    if at > now + MAX_FUTURE or at < now - MAX_AGE:
        raise YimiError("invalid_frame", "at must be within the last 7 days and not ahead of the server's clock by more than 5 minutes")
    message = report_message(str(device.id), nonce, frame_id, lat, lon, accuracy, frame["at"])
    if not device.verify_signature(message, frame.get("signature")):
        raise YimiError("bad_signature", "the location report is not signed by this device's key")
    existing = LocationReport.objects.filter(device=device, client_id=frame_id).first()
    if existing is not None:
        return RecordedReport(existing, True)
    try:
        with transaction.atomic():
            report = LocationReport.objects.create(
                owner_id=device.owner_id, device=device, device_label=device.name[:64], client_id=frame_id,
                lat=round(lat, 7), lon=round(lon, 7), accuracy_m=round(accuracy, 1), at=at,
            )
    except IntegrityError:  # the same frame, stored by a concurrent resend
        return RecordedReport(LocationReport.objects.get(device=device, client_id=frame_id), True)
    return RecordedReport(report, False)


def latest_report(owner_id: int) -> LocationReport | None:
    return LocationReport.objects.filter(owner_id=owner_id).order_by("-at", "-received_at").first()


def report_payload(report: LocationReport) -> dict[str, Any]:
    return {
        "id": str(report.id), "lat": report.lat, "lon": report.lon, "accuracy_m": report.accuracy_m,
        "at": report.at.isoformat(), "device": report.device_label,
    }


# --- places -----------------------------------------------------------------------------------------


def place_name(value: Any) -> str:
    name = " ".join(value.split()) if isinstance(value, str) else ""
    if not 1 <= len(name) <= MAX_NAME:
        raise YimiError("invalid_request", f"a place's name is 1 to {MAX_NAME} characters")
    return name


def place_payload(place: Place) -> dict[str, Any]:
    return {"name": place.name, "lat": place.lat, "lon": place.lon, "radius_m": place.radius_m, "updated_at": place.updated_at.isoformat()}


def list_places(owner_id: int) -> list[Place]:
    return list(Place.objects.filter(owner_id=owner_id).order_by("name"))


def get_place(owner_id: int, name: Any) -> Place:
    place = Place.objects.filter(owner_id=owner_id, name=place_name(name)).first()
    if place is None:
        raise YimiError("not_found", f"there is no place named {place_name(name)!r}")
    return place


@transaction.atomic
def set_place(owner_id: int, name: Any, *, lat: Any = None, lon: Any = None, radius_m: Any = None, here: bool = False) -> tuple[Place, bool]:
    """Create or move the place ``name``: at (lat, lon), or at the latest report (``here``).
    Returns (place, created)."""
    name = place_name(name)
    if here:
        if lat is not None or lon is not None:
            raise YimiError("invalid_request", "give lat and lon, or here, not both")
        latest = latest_report(owner_id)
        if latest is None:
            raise YimiError("no_location", "no location report has arrived from the owner's phone yet")
        lat_f, lon_f = latest.lat, latest.lon
    else:
        lat_f, lon_f = coordinates(lat, lon, code="invalid_request")
    radius = DEFAULT_RADIUS_M if radius_m is None else _number(radius_m, "radius_m", MIN_RADIUS_M, MAX_RADIUS_M, code="invalid_request")
    existing = Place.objects.select_for_update().filter(owner_id=owner_id, name=name).first()
    if existing is None:
        if Place.objects.filter(owner_id=owner_id).count() >= MAX_PLACES:
            raise YimiError("too_many_places", f"at most {MAX_PLACES} places: remove one first")
        return Place.objects.create(owner_id=owner_id, name=name, lat=round(lat_f, 7), lon=round(lon_f, 7), radius_m=radius), True
    existing.lat, existing.lon, existing.radius_m = round(lat_f, 7), round(lon_f, 7), radius
    existing.save(update_fields=["lat", "lon", "radius_m", "updated_at"])
    return existing, False


def remove_place(owner_id: int, name: Any) -> Place:
    """Delete the place ``name`` (``not_found`` if there is none); returns the removed row."""
    place = get_place(owner_id, name)
    Place.objects.filter(id=place.id).delete()
    return place


def place_state(place: Place, report: LocationReport | None) -> str | None:
    """``inside`` / ``outside`` the place's circle for this report; None without a report
    or when the report is coarser than the circle (accuracy radius > place radius)."""
    if report is None or report.accuracy_m > place.radius_m:
        return None
    return "inside" if haversine_m(report.lat, report.lon, place.lat, place.lon) <= place.radius_m else "outside"


def places_inside(owner_id: int, report: LocationReport | None) -> list[str]:
    return [p.name for p in list_places(owner_id) if place_state(p, report) == "inside"]


def resolve_point(owner_id: int, spec: Any) -> tuple[float, float, str]:
    """A point named in a distance request: ``{"place": name}``, ``{"lat", "lon"}`` or
    ``"here"`` (the latest report). Returns (lat, lon, label)."""
    if spec == "here" or (isinstance(spec, dict) and spec.get("here") is True):
        latest = latest_report(owner_id)
        if latest is None:
            raise YimiError("no_location", "no location report has arrived from the owner's phone yet")
        return latest.lat, latest.lon, "here"
    if isinstance(spec, dict) and "place" in spec:
        place = get_place(owner_id, spec["place"])
        return place.lat, place.lon, place.name
    if isinstance(spec, dict) and "lat" in spec and "lon" in spec:
        lat, lon = coordinates(spec["lat"], spec["lon"], code="invalid_request")
        return lat, lon, f"{lat:.5f},{lon:.5f}"
    raise YimiError("invalid_request", 'a point is {"place": name}, {"lat": .., "lon": ..} or "here"')


def distance(owner_id: int, origin: Any, target: Any) -> dict[str, Any]:
    lat1, lon1, label1 = resolve_point(owner_id, origin)
    lat2, lon2, label2 = resolve_point(owner_id, target)
    return {"from": label1, "to": label2, "distance_m": round(haversine_m(lat1, lon1, lat2, lon2))}
