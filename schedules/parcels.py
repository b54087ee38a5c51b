"""Followed parcels ("快递到了告诉我"): watches of ``delivery__track``, made and ended by the
``delivery`` pack's ``follow`` tool (``/internal/watches/parcels/``, platform API ``watches``).

A followed parcel is a ``Watch`` (``schedules.watches``) of the tool ``delivery__track`` with
arguments ``{"tracking_number": n}``, state path ``content.arrival`` (the track receipt's
``not_delivered`` / ``delivered``, whatever the carrier's own state: ``in_transit``,
``out_for_delivery``, ...), ``s_from`` ``not_delivered`` and ``s_to`` ``delivered``; it is
checked every ``INTERVAL_SECONDS`` through the gateway like any watch and is one-time
(``Watch.once``): it notifies once when the parcel is delivered and ends when a device ACKs
that notice. Following a number already followed is the same watch (no second one);
stopping ends every active watch of that number. A watch's checks are bound to the device
of the run that asked (else the owner's most recently seen own device).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from brain.models import Run
from schedules import watches
from schedules.models import Watch
from yimi_project.errors import YimiError

TOOL = "delivery__track"
STATE_PATH = "content.arrival"
NOT_DELIVERED = "not_delivered"
DELIVERED = "delivered"
INTERVAL_SECONDS = 1800
MAX_FOLLOWED = 50
MAX_NUMBER = 64


def tracking_number(value: Any) -> str:
    number = value.strip() if isinstance(value, str) else ""
    if not 1 <= len(number) <= MAX_NUMBER:
        raise YimiError("invalid_request", f"tracking_number must be 1 to {MAX_NUMBER} characters")
    return number


def parcel_payload(watch: Watch) -> dict[str, Any]:
    return {
        "tracking_number": (watch.arguments or {}).get("tracking_number"), "label": watch.label, "watch_id": str(watch.id),
        "last_state": watch.last_state or None, "last_checked_at": watch.last_checked_at.isoformat() if watch.last_checked_at else None,
        "active": watch.active, "created_at": watch.created_at.isoformat(),
    }


def followed(owner_id: int) -> list[Watch]:
    """The owner's followed parcels (active watches of the track tool), oldest first."""
    return list(Watch.objects.filter(owner_id=owner_id, tool=TOOL, active=True).order_by("created_at"))


def _device_for(owner: Any, run_key: Any) -> Any:
    run = None
    try:
        run = Run.objects.select_related("origin_device").filter(id=uuid.UUID(str(run_key))).first()
    except ValueError:  # a contract run's key is not a run's id
        pass
    device = run.origin_device if run is not None else None
    if device is not None and device.owner_id == owner.pk and not device.is_guest and device.revoked_at is None:
        return device
    latest = owner.devices.filter(is_guest=False, revoked_at__isnull=True).order_by("-last_seen_at", "-paired_at").first()
    if latest is None:
        raise YimiError("conflict", "the owner has no paired device to send the parcel's notice to")
    return latest


def follow(owner: Any, number: Any, *, label: Any = None, known: Any = "", run_key: Any = None,
           now: datetime | None = None) -> tuple[Watch, bool]:
    """Follow the parcel ``number``: (its watch, created). ``known`` is the arrival state the
    pack just read from the carrier (``not_delivered``, or empty); a parcel already delivered
    is not followed (the pack says so without calling here)."""
    number = tracking_number(number)
    if known not in ("", NOT_DELIVERED):
        raise YimiError("invalid_request", f"state is {NOT_DELIVERED!r} or empty (a delivered parcel is not followed)")
    if label is not None and (not isinstance(label, str) or len(label) > 100):
        raise YimiError("invalid_request", "label is a string of at most 100 characters")
    existing = Watch.objects.filter(owner=owner, tool=TOOL, active=True, arguments__tracking_number=number).order_by("created_at").first()
    if existing is not None:
        return existing, False
    if len(followed(owner.pk)) >= MAX_FOLLOWED:
        raise YimiError("conflict", f"at most {MAX_FOLLOWED} parcels are followed at once: stop following one first")
    watch = watches.create_watch(
        owner, _device_for(owner, run_key), label=(label or "").strip() or f"快递 {number}", tool=TOOL,
        arguments={"tracking_number": number}, state_path=STATE_PATH, s_from=NOT_DELIVERED, s_to=DELIVERED,
        interval_seconds=INTERVAL_SECONDS, now=now, once=True, last_state=known,
    )
    return watch, True


def unfollow(owner_id: int, number: Any) -> list[str]:
    """Stop following ``number``: the ids of the watches ended (empty if none was active;
    ``not_found`` if the number was never followed)."""
    number = tracking_number(number)
    mine = Watch.objects.filter(owner_id=owner_id, tool=TOOL, arguments__tracking_number=number)
    if not mine.exists():
        raise YimiError("not_found", f"the parcel {number} is not followed")
    return [str(w.id) for w in mine.filter(active=True) if watches.cancel_watch(owner_id, w.id)]
