"""Geofences ("我到家了告诉我"): watches on a named place, driven by location reports.

A geofence is a ``Watch`` (``schedules.watches``) of the tool ``location__where`` with
arguments ``{"place": name}``, state path ``content.place.state``, ``s_from`` ``outside``
and ``s_to`` ``inside``. So it notifies by the watches' rule: when the state moves to
``inside`` from ``outside`` (or from nothing known) — once per entry: further reports
inside change nothing, leaving sets ``outside``.

- **One-time** (``repeat`` false, the default: "when I get home"): ``Watch.once``; it
  notifies at the first entry only and ends when a device ACKs that notice.
- **Repeating** (``repeat`` true: "every time I get to the office"): leaving and coming
  back notifies again.

What drives it: every stored location report that is the owner's latest
(``on_location_report``, called by the device socket) — the state is computed here from
the report and the place (``memory.personal.location.place_state``) and recorded with
``watches.observe_state``. A report coarser than the place (accuracy radius larger than
the place's radius) tells nothing and changes nothing. As a fallback (a report stored but
its evaluation lost, e.g. the process died in between) the watch is also checked like any
watch, every ``FALLBACK_INTERVAL_SECONDS``, through the gateway (``location__where``
answers from the same latest report). When a geofence is created, the state of the latest
report is its starting state: created while the owner is already inside, it first
notifies after leaving and coming back.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.utils import timezone

from brain.models import Run
from memory.personal import location
from memory.personal.models import LocationReport, Place
from schedules import watches
from schedules.models import Watch
from yimi_project.errors import YimiError

TOOL = "location__where"
STATE_PATH = "content.place.state"
FALLBACK_INTERVAL_SECONDS = 3600
MAX_GEOFENCES = 50


def _device_for(owner_id: int, run_key: Any) -> Any:
    """The device the watch's checks are bound to: the run's, else the phone that reported last."""
    run = None
    if _as_uuid_list(run_key):  # a contract run's key is not a run's id
        run = Run.objects.select_related("origin_device").filter(id=_as_uuid_list(run_key)[0]).first()
    device = run.origin_device if run is not None else None
    if device is not None and device.owner_id == owner_id and not device.is_guest and device.revoked_at is None:
        return device
    latest = LocationReport.objects.filter(owner_id=owner_id, device__isnull=False).select_related("device").order_by("-at").first()
    if latest is not None and latest.device is not None:
        return latest.device
    raise YimiError("no_location", "no run device and no location report from the owner's phone to bind the geofence to")


def geofence_payload(watch: Watch) -> dict[str, Any]:
    return {
        "watch_id": str(watch.id), "place": (watch.arguments or {}).get("place"), "repeat": not watch.once,
        "active": watch.active, "last_state": watch.last_state or None, "created_at": watch.created_at.isoformat(),
    }


def active_geofences(owner_id: int) -> list[Watch]:
    return list(Watch.objects.filter(owner_id=owner_id, tool=TOOL, active=True).order_by("created_at"))


def create_geofence(owner: Any, place_name: Any, *, repeat: Any = False, run_key: Any = None, now: datetime | None = None) -> Watch:
    """A geofence on the owner's place ``place_name`` (``not_found`` if there is none)."""
    if not isinstance(repeat, bool):
        raise YimiError("invalid_request", "repeat is true or false")
    place = location.get_place(owner.pk, place_name)
    if len(active_geofences(owner.pk)) >= MAX_GEOFENCES:
        raise YimiError("too_many_geofences", f"at most {MAX_GEOFENCES} active geofences: cancel one first")
    device = _device_for(owner.pk, run_key)
    start = location.place_state(place, location.latest_report(owner.pk)) or ""
    return watches.create_watch(
        owner, device, label=f"到达 {place.name}", tool=TOOL, arguments={"place": place.name}, state_path=STATE_PATH,
        s_from="outside", s_to="inside", interval_seconds=FALLBACK_INTERVAL_SECONDS, now=now, once=not repeat, last_state=start,
    )


def cancel_geofence(owner_id: int, watch_id: Any) -> bool:
    owner_watch = Watch.objects.filter(owner_id=owner_id, tool=TOOL).filter(id__in=_as_uuid_list(watch_id)).first()
    if owner_watch is None:
        raise YimiError("not_found", "no geofence with this watch_id")
    return watches.cancel_watch(owner_id, owner_watch.id)


def _as_uuid_list(value: Any) -> list[str]:
    try:
        return [str(uuid.UUID(str(value)))]
    except ValueError:
        return []


def on_location_report(report: LocationReport, *, now: datetime | None = None) -> list[Any]:
    """Evaluate the owner's active geofences against a newly stored report (only if it is
    the owner's latest: a late report of an earlier moment changes nothing). Returns the
    notices written."""
    now = now or timezone.now()
    latest = location.latest_report(report.owner_id)
    if latest is None or latest.id != report.id:
        return []
    notices = []
    for watch in active_geofences(report.owner_id):
        place = _place_of(watch)
        state = location.place_state(place, report) if place is not None else None
        if state is None:
            continue
        notice = watches.observe_state(watch.id, state, now=now)
        if notice is not None:
            notices.append(notice)
    return notices


def _place_of(watch: Watch) -> Place | None:
    return Place.objects.filter(owner_id=watch.owner_id, name=(watch.arguments or {}).get("place")).first()
