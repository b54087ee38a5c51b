"""The owner's health records: the only code that writes ``HealthRecord``.

A ``health.record`` frame (docs/protocol.md, "Location and health") comes from the owner's
own watch (rides and other sport sessions) or phone (daily summaries) over
``/ws/device/`` and is stored by ``record``. Steps: 1. the device is one of the owner's
own, not a guest's, and a watch or a phone (``forbidden``); 2. the fields
(``invalid_frame``): ``id`` 1-64 characters; ``kind`` one of ``HealthRecord.Kind``; ``start``
and ``end`` ISO 8601 with a time zone, ``start`` ≤ ``end``, at most 48 hours apart, ``end``
not more than 5 minutes ahead of the server's clock; ``metrics`` an object of at most
``MAX_METRICS`` keys (``[a-z][a-z0-9_]{0,39}``), each value a finite number (not a
boolean) of size at most 10^12, at most ``MAX_METRICS_BYTES`` as compact JSON; 3. the row; a resend of the same
``id`` from the same device returns the stored row (``duplicate``). Anything refused
stores nothing.

Reads: ``read`` (the ``health`` pack's ``read`` tool, by time range) and ``short_context``
(the call short context's ``health`` source: the latest daily summary and today's
activities in the owner's time zone, at most ``SHORT_CONTEXT_CHARS``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import User
from accounts.services import device_scope_limit
from memory.personal.location import parse_instant
from memory.personal.models import HealthRecord
from yimi_project.errors import YimiError

MAX_METRICS = 32
MAX_METRICS_BYTES = 4096
MAX_METRIC_VALUE = 1e12
MAX_SPAN = timedelta(hours=48)
MAX_FUTURE = timedelta(minutes=5)
METRIC_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
RECORD_KINDS = ("watch", "phone")
MAX_READ = 100
SHORT_CONTEXT_CHARS = 600
SHORT_CONTEXT_ACTIVITIES = 5
SHORT_CONTEXT_METRICS = 8


@dataclass(frozen=True)
class RecordedHealth:
    record: HealthRecord
    duplicate: bool


def check_metrics(value: Any) -> dict[str, float | int]:
    if not isinstance(value, dict):
        raise YimiError("invalid_frame", "metrics must be an object of numbers")
    if len(value) > MAX_METRICS:
        raise YimiError("invalid_frame", f"metrics has at most {MAX_METRICS} keys")
    metrics: dict[str, float | int] = {}
    for name, number in value.items():
        if not METRIC_NAME.fullmatch(name):
            raise YimiError("invalid_frame", "metric names are lower case letters, digits and _ (at most 40, a letter first)")
        if isinstance(number, bool) or not isinstance(number, int | float) or (isinstance(number, float) and not math.isfinite(number)):
            raise YimiError("invalid_frame", f"metric {name!r} must be a finite number")
        if abs(number) > MAX_METRIC_VALUE:
            raise YimiError("invalid_frame", f"metric {name!r} is out of range (at most {MAX_METRIC_VALUE:.0e} in size)")
        metrics[name] = number
    if len(json.dumps(metrics, separators=(",", ":")).encode()) > MAX_METRICS_BYTES:
        raise YimiError("invalid_frame", f"metrics are limited to {MAX_METRICS_BYTES} bytes")
    return metrics


def record(device: Any, frame: dict[str, Any], *, now: datetime | None = None) -> RecordedHealth:
    """Store one ``health.record`` of ``device`` (the steps are in the module's docstring)."""
    now = now or timezone.now()
    if device_scope_limit(device) is not None:
        raise YimiError("forbidden", "only the owner's own devices submit the owner's health records")
    if device.kind not in RECORD_KINDS:
        raise YimiError("forbidden", "health records come from the owner's watch or phone")
    frame_id = frame.get("id")
    if not isinstance(frame_id, str) or not 1 <= len(frame_id) <= 64:
        raise YimiError("invalid_frame", "a health record needs an id of 1 to 64 characters")
    kind = frame.get("kind")
    if kind not in HealthRecord.Kind.values:
        raise YimiError("invalid_frame", f"kind is one of {', '.join(HealthRecord.Kind.values)}")
    start, end = parse_instant(frame.get("start"), "start"), parse_instant(frame.get("end"), "end")
    if end < start or end - start > MAX_SPAN:
        raise YimiError("invalid_frame", "end is after start, at most 48 hours later")
    if end > now + MAX_FUTURE:
        raise YimiError("invalid_frame", "end is ahead of the server's clock")
    metrics = check_metrics(frame.get("metrics"))
    existing = HealthRecord.objects.filter(device=device, client_id=frame_id).first()
    if existing is not None:
        return RecordedHealth(existing, True)
    try:
        with transaction.atomic():
            row = HealthRecord.objects.create(
                owner_id=device.owner_id, device=device, device_label=device.name[:64], device_kind=device.kind,
                client_id=frame_id, kind=kind, start=start, end=end, metrics=metrics,
            )
    except IntegrityError:
        return RecordedHealth(HealthRecord.objects.get(device=device, client_id=frame_id), True)
    return RecordedHealth(row, False)


def record_payload(row: HealthRecord) -> dict[str, Any]:
    return {
        "id": str(row.id), "kind": row.kind, "start": row.start.isoformat(), "end": row.end.isoformat(),
        "duration_s": int((row.end - row.start).total_seconds()), "metrics": row.metrics, "device": row.device_label,
    }


def read(owner_id: int, *, after: Any = None, before: Any = None, kind: Any = None, limit: Any = 50) -> list[HealthRecord]:
    """The owner's records starting in [after, before), newest first (at most ``MAX_READ``)."""
    rows = HealthRecord.objects.filter(owner_id=owner_id)
    if after is not None:
        rows = rows.filter(start__gte=parse_instant(after, "after", code="invalid_request"))
    if before is not None:
        rows = rows.filter(start__lt=parse_instant(before, "before", code="invalid_request"))
    if kind is not None:
        if kind not in HealthRecord.Kind.values:
            raise YimiError("invalid_request", f"kind is one of {', '.join(HealthRecord.Kind.values)}")
        rows = rows.filter(kind=kind)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_READ:
        raise YimiError("invalid_request", f"limit is 1 to {MAX_READ}")
    return list(rows.order_by("-start", "-received_at")[:limit])


def _metrics_text(metrics: dict[str, Any]) -> str:
    shown = [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in list(metrics.items())[:SHORT_CONTEXT_METRICS]]
    return ", ".join(shown) + (", …" if len(metrics) > SHORT_CONTEXT_METRICS else "")


def short_context(owner_id: int, *, now: datetime | None = None) -> str:
    """The latest daily summary and today's activities (owner's time zone), one line each,
    at most ``SHORT_CONTEXT_CHARS`` in total (whole lines only)."""
    now = now or timezone.now()
    name = User.objects.filter(id=owner_id).values_list("time_zone", flat=True).first() or "UTC"
    try:
        zone = ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        zone = ZoneInfo("UTC")
    local = now.astimezone(zone)
    midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
    lines: list[str] = []
    summary = HealthRecord.objects.filter(owner_id=owner_id, kind=HealthRecord.Kind.DAILY_SUMMARY).order_by("-start").first()
    if summary is not None:
        lines.append(f"- daily summary {summary.start.astimezone(zone):%Y-%m-%d}: {_metrics_text(summary.metrics)}")
    activities = (
        HealthRecord.objects.filter(owner_id=owner_id, start__gte=midnight, start__lte=now).exclude(kind=HealthRecord.Kind.DAILY_SUMMARY)
        .order_by("-start")[:SHORT_CONTEXT_ACTIVITIES]
    )
    for row in reversed(list(activities)):
        minutes = int((row.end - row.start).total_seconds() // 60)
        lines.append(f"- today {row.kind} {row.start.astimezone(zone):%H:%M}, {minutes} min: {_metrics_text(row.metrics)}")
    text = ""
    for line in lines:
        line = line[:200]
        if len(text) + len(line) + 1 > SHORT_CONTEXT_CHARS:
            break
        text = f"{text}\n{line}" if text else line
    return text
