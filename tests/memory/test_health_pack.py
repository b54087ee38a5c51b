"""The ``health`` pack and its platform side: ``health.record`` frames from the owner's watch
and phone (``memory.personal.health``), bounded and stored per owner, read by the pack's ``read``
tool and by the call short context's health source."""

from __future__ import annotations

import io
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from capabilities.contract import run_contract
from capabilities.manifest import load_pack
from memory import short_context
from memory.personal import health
from memory.personal.models import HealthRecord
from tests.conftest import db_async, internal_client, new_client_id, pack_capability, receive_until
from tests.devices.test_owner_mac import open_device
from tests.memory.test_location_pack import device_of_kind
from tests.schedules.test_watches import report_text
from yimi_project.call_capability import HEADER as CAP
from yimi_project.errors import YimiError

PACK = Path(__file__).resolve().parents[2] / "packs" / "health"


def ride(start: datetime | None = None, **overrides: Any) -> dict[str, Any]:
    start = start or timezone.now() - timedelta(hours=1)
    frame = {"type": "health.record", "id": new_client_id(), "kind": "cycling", "start": start.isoformat(),
             "end": (start + timedelta(minutes=45)).isoformat(),
             "metrics": {"distance_m": 15200, "avg_heart_rate_bpm": 132, "active_energy_kcal": 410.5}}
    frame.update(overrides)
    return frame


def day_summary(day: datetime, **metrics: Any) -> dict[str, Any]:
    return {"type": "health.record", "id": new_client_id(), "kind": "daily_summary", "start": day.isoformat(),
            "end": (day + timedelta(hours=23, minutes=59)).isoformat(), "metrics": metrics or {"steps": 8421, "sleep_minutes": 412}}


async def submit(comm: Any, frame: dict[str, Any] | str) -> dict[str, Any]:
    if isinstance(frame, str):
        await comm.send_to(text_data=frame)
    else:
        await comm.send_json_to(frame)
    return await receive_until(comm, "health.record.ok", "error")


# --- frames over the device socket ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_a_ride_from_the_watch_and_a_summary_from_the_phone_are_stored_per_owner(make_device: Any, owner: Any) -> None:
    watch = await db_async(device_of_kind)(make_device, "watch")
    comm = await open_device(watch)
    try:
        frame = ride()
        ok = await submit(comm, frame)
        assert ok["type"] == "health.record.ok" and ok["duplicate"] is False and ok["id"] == frame["id"], ok
        again = await submit(comm, frame)  # a resend is the same record
        assert (again["duplicate"], again["record_id"]) == (True, ok["record_id"])
    finally:
        await comm.disconnect()
    phone = await db_async(make_device)("phone")
    comm = await open_device(phone)
    try:
        assert (await submit(comm, day_summary(timezone.now() - timedelta(days=1))))["type"] == "health.record.ok"
    finally:
        await comm.disconnect()
    rows = await db_async(lambda: list(HealthRecord.objects.order_by("kind").values("owner_id", "kind", "device_kind", "metrics")))()
    assert rows == [
        {"owner_id": owner.pk, "kind": "cycling", "device_kind": "watch", "metrics": {"distance_m": 15200, "avg_heart_rate_bpm": 132, "active_energy_kcal": 410.5}},
        {"owner_id": owner.pk, "kind": "daily_summary", "device_kind": "phone", "metrics": {"steps": 8421, "sleep_minutes": 412}},
    ]


TOO_MANY = {f"m{i}": i for i in range(33)}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("change", [
    {"metrics": TOO_MANY},
    {"metrics": {"steps": "8421"}},
    {"metrics": {"steps": True}},
    {"metrics": {"steps": 10**13}},
    {"metrics": {"Steps": 1}},
    {"metrics": {"x" * 41: 1}},
    {"metrics": [1, 2]},
    {"kind": "sleeping"},
    {"start": "2026-01-01T08:00:00"},
    {"end": "before"},
    {"end": "too long"},
    {"end": "future"},
    {"id": ""},
])
async def test_a_record_out_of_bounds_is_refused_and_nothing_is_stored(make_device: Any, change: dict[str, Any]) -> None:
    watch = await db_async(device_of_kind)(make_device, "watch")
    start = timezone.now() - timedelta(hours=3)
    frame = ride(start)
    relative = {"before": start - timedelta(seconds=1), "too long": start + timedelta(hours=49),
                "future": timezone.now() + timedelta(minutes=10)}
    if change.get("end") in relative:
        frame["end"] = relative[change["end"]].isoformat()
    else:
        frame.update(change)
    comm = await open_device(watch)
    try:
        answer = await submit(comm, frame)
        assert (answer["type"], answer.get("code")) == ("error", "invalid_frame"), answer
        nan = json.dumps(ride()).replace("15200", "NaN")  # Python's parser takes NaN; it is not JSON
        assert (await submit(comm, nan)).get("code") == "malformed_json"  # docs/protocol.md, the websocket
    finally:
        await comm.disconnect()
    assert not await db_async(HealthRecord.objects.exists)()


@pytest.mark.django_db
def test_thirty_two_metrics_pass_and_the_byte_bound_holds(make_device: Any, owner: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    watch = device_of_kind(make_device, "watch")
    stored = health.record(watch.device, ride(metrics={f"m{i}": i * 1.5 for i in range(32)}))
    assert len(stored.record.metrics) == 32
    monkeypatch.setattr(health, "MAX_METRICS_BYTES", 64)
    with pytest.raises(YimiError) as refused:
        health.record(watch.device, ride(metrics={f"metric_{i}": 123456.789 for i in range(8)}))
    assert refused.value.code == "invalid_frame" and "bytes" in refused.value.message
    assert HealthRecord.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind,guest", [("watch", True), ("phone", True), ("glasses", False), ("mac", False)])
async def test_guests_devices_and_other_kinds_cannot_submit(make_device: Any, kind: str, guest: bool) -> None:
    sim = await db_async(device_of_kind)(make_device, kind, guest=guest)
    comm = await open_device(sim)
    try:
        answer = await submit(comm, ride())
        assert (answer["type"], answer.get("code")) == ("error", "forbidden"), answer
    finally:
        await comm.disconnect()
    assert not await db_async(HealthRecord.objects.exists)()


# --- reads: the short call context and the read tool -------------------------------------------------


@pytest.mark.django_db
def test_the_short_call_context_tells_the_latest_summary_and_todays_activities(make_device: Any, owner: Any) -> None:
    owner.time_zone = "Asia/Shanghai"
    owner.save(update_fields=["time_zone"])
    zone = ZoneInfo("Asia/Shanghai")
    now = datetime(2026, 3, 10, 20, 0, tzinfo=zone)
    watch, phone = device_of_kind(make_device, "watch"), make_device("phone")
    midnight = now.replace(hour=0, minute=0)
    health.record(phone.device, day_summary(midnight - timedelta(days=2), steps=1111), now=now)
    health.record(phone.device, day_summary(midnight - timedelta(days=1), steps=8421, sleep_minutes=412), now=now)
    health.record(watch.device, ride(midnight - timedelta(hours=2), metrics={"distance_m": 999}), now=now)  # yesterday evening
    health.record(watch.device, ride(now.replace(hour=7, minute=30), metrics={"distance_m": 15200}), now=now)
    health.record(watch.device, ride(now.replace(hour=18), kind="running", metrics={"distance_m": 5000, "avg_pace_s_per_km": 330.5}), now=now)
    text = health.short_context(owner.pk, now=now)
    assert text.splitlines() == [
        "- daily summary 2026-03-09: steps=8421, sleep_minutes=412",
        "- today cycling 07:30, 45 min: distance_m=15200",
        "- today running 18:00, 45 min: distance_m=5000, avg_pace_s_per_km=330.5",
    ]
    # bounded: many activities today, each with many metrics, stay within the limit in whole lines
    for hour in range(8, 18):
        health.record(watch.device, ride(now.replace(hour=hour), metrics={f"metric_number_{i}": 123456.789 for i in range(20)}), now=now)
    bounded = health.short_context(owner.pk, now=now)
    assert len(bounded) <= health.SHORT_CONTEXT_CHARS and bounded.startswith("- daily summary 2026-03-09")
    assert len(bounded.splitlines()) <= 1 + health.SHORT_CONTEXT_ACTIVITIES


@pytest.mark.django_db(transaction=True)  # the sources read on threads of their own
def test_the_health_source_of_the_call_short_context_reads_the_stored_records(make_device: Any, owner: Any) -> None:
    phone = make_device("phone")
    health.record(phone.device, day_summary(timezone.now() - timedelta(days=1), steps=7777))
    context = short_context.call_short_context(owner.pk)
    assert "health" in context.included and "steps=7777" in context.text
    assert "steps=7777" in short_context.health_source(owner.pk)


@pytest.mark.django_db
def test_the_read_endpoint_reads_a_time_range_for_a_health_call_only(make_device: Any, owner: Any) -> None:
    watch = device_of_kind(make_device, "watch")
    base = timezone.now() - timedelta(days=3)
    for day in range(3):
        health.record(watch.device, ride(base + timedelta(days=day)))
    url = "/internal/health/read/"
    reader = internal_client(**{CAP: pack_capability(owner.pk, pack="health", category="observe", apis=["health"], tool="health__read")})
    body = {"after": (base + timedelta(hours=12)).isoformat(), "before": (base + timedelta(days=2, hours=12)).isoformat()}
    got = reader.post(url, body, content_type="application/json").json()
    assert got["count"] == 2 and [r["start"] for r in got["records"]] == [
        (base + timedelta(days=d)).isoformat() for d in (2, 1)
    ]
    bad = reader.post(url, {"after": "yesterday"}, content_type="application/json")
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_request")
    other = internal_client(**{CAP: pack_capability(owner.pk, pack="memory", category="observe", apis=["memory"])})
    assert other.post(url, {}, content_type="application/json").status_code == 403


# --- the pack ----------------------------------------------------------------------------------------------


def test_the_manifest_declares_one_read_tool_that_only_observes() -> None:
    pack = load_pack(PACK)
    assert list(pack.tools) == ["read"] and pack.tools["read"].resolve_category({}) == "observe"
    assert pack.platform_api == ["health"] and pack.secrets == [] and pack.egress == [] and pack.enabled_by_default


def test_the_health_contract_passes_on_the_fake() -> None:
    report = run_contract(PACK, fake=True)
    assert report.passed, report_text(report)
    assert len(report.cases) == 3


@pytest.mark.django_db(transaction=True)
def test_pack_contract_health_both_against_the_platform(internal_listener: Any, owner: Any) -> None:
    from django.core.management import call_command

    out = io.StringIO()
    call_command("pack_contract", "health", "--both", "--against-live", stdout=out)
    text = out.getvalue()
    assert "health  real  pass" in text and "health  fake  pass" in text and "2/2 contract runs passed" in text, text
