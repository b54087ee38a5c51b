"""The ``location`` pack and its platform side: signed location reports from the owner's
phone (``memory.personal.location``), named places, haversine distances, and arrival geofences as
watches (``schedules.geofences``), over a real websocket and through the gateway."""

from __future__ import annotations

import asyncio
import io
import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from brain.services import accept_utterance
from capabilities.contract import run_contract
from capabilities.manifest import load_pack
from memory.personal import location
from memory.personal.models import LocationReport, Place
from schedules import geofences, watches
from schedules.models import Watch, WatchNotice
from tests.accounts.test_owner_console import logged_in
from tests.conftest import db_async, internal_client, new_client_id, pack_capability, receive_until
from tests.devices.test_owner_mac import open_device
from tests.schedules.test_watches import report_text
from yimi_project.call_capability import HEADER as CAP
from yimi_project.errors import YimiError

PACK = Path(__file__).resolve().parents[2] / "packs" / "location"
HOME = (39.9087, 116.3975)  # 天安门
NEAR_HOME = (39.9092, 116.3980)  # about 70 m away
AWAY = (39.9042, 116.4074)  # about 1 km away


def device_of_kind(make_device: Any, kind: str, *, guest: bool = False) -> Any:
    """A paired device of ``kind`` (a watch relays through a phone paired first)."""
    if kind == "watch":
        return make_device("watch", guest=guest, relay_via=str(make_device("phone", guest=guest).device.id))
    return make_device(kind, guest=guest)


def signed_report(sim: Any, nonce: str, lat: float, lon: float, *, accuracy_m: float = 10.0, at: str | None = None,
                  frame_id: str | None = None, key_of: Any = None) -> dict[str, Any]:
    frame_id = frame_id or new_client_id()
    at = at or timezone.now().isoformat()
    message = location.report_message(str(sim.device.id), nonce, frame_id, lat, lon, accuracy_m, at)
    return {"type": "location.report", "id": frame_id, "lat": lat, "lon": lon, "accuracy_m": accuracy_m, "at": at,
            "signature": (key_of or sim).sign(message)}


async def report(comm: Any, sim: Any, lat: float, lon: float, **kwargs: Any) -> dict[str, Any]:
    """Send a signed report and wait for its answer; watch notices that arrive meanwhile
    are kept on ``comm.yimi_notices``."""
    await comm.send_json_to(signed_report(sim, comm.yimi_nonce, lat, lon, **kwargs))
    while True:
        frame = await comm.receive_json_from()
        if frame["type"] == "notice" and frame.get("code") == "watch":
            comm.__dict__.setdefault("yimi_notices", []).append(frame)
        elif frame["type"] in ("location.report.ok", "error"):
            return frame


# --- haversine ------------------------------------------------------------------------------------


@pytest.mark.parametrize("a,b,km", [
    ((39.9042, 116.4074), (31.2304, 121.4737), 1067.3),  # Beijing - Shanghai (great circle ≈ 1,067 km)
    ((51.5074, -0.1278), (48.8566, 2.3522), 343.6),  # London - Paris (≈ 344 km)
    ((40.6413, -73.7781), (51.4700, -0.4543), 5554.0),  # JFK - Heathrow (≈ 5,554 km on the ellipsoid)
])
def test_haversine_gives_the_known_great_circle_distances(a: tuple[float, float], b: tuple[float, float], km: float) -> None:
    # published distances; the sphere of the mean radius is within 0.5 % of the ellipsoid
    assert location.haversine_m(*a, *b) / 1000 == pytest.approx(km, rel=0.005)
    assert location.haversine_m(*a, *b) == pytest.approx(location.haversine_m(*b, *a))


def test_haversine_of_a_point_is_zero_and_of_antipodes_half_the_circumference() -> None:
    assert location.haversine_m(*HOME, *HOME) == 0.0
    assert location.haversine_m(0.0, 0.0, 0.0, 180.0) == pytest.approx(math.pi * location.EARTH_RADIUS_M)
    assert location.haversine_m(90.0, 0.0, -90.0, 0.0) == pytest.approx(math.pi * location.EARTH_RADIUS_M)


# --- reports over the device socket ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_a_signed_report_from_the_owners_phone_is_stored_once(make_device: Any, owner: Any) -> None:
    phone = await db_async(make_device)("phone")
    comm = await open_device(phone)
    try:
        frame = signed_report(phone, comm.yimi_nonce, 39.90871234, 116.39751234, accuracy_m=12.34)
        await comm.send_json_to(frame)
        ok = await receive_until(comm, "location.report.ok", "error")
        assert ok["type"] == "location.report.ok" and ok["duplicate"] is False and ok["id"] == frame["id"], ok
        await comm.send_json_to(frame)  # a resend of the same frame is the same report
        again = await receive_until(comm, "location.report.ok", "error")
        assert (again["duplicate"], again["report_id"]) == (True, ok["report_id"])
    finally:
        await comm.disconnect()
    stored = await db_async(lambda: list(LocationReport.objects.values("owner_id", "device_id", "lat", "lon", "accuracy_m")))()
    assert stored == [{"owner_id": owner.pk, "device_id": phone.device.id, "lat": 39.9087123, "lon": 116.3975123, "accuracy_m": 12.3}]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("change,code", [
    ({"lat": 90.5}, "invalid_frame"),
    ({"lon": -180.01}, "invalid_frame"),
    ({"accuracy_m": 0}, "invalid_frame"),
    ({"accuracy_m": 10_000.5}, "invalid_frame"),
    ({"lat": True}, "invalid_frame"),
    ({"at": "2026-01-01T08:00:00"}, "invalid_frame"),  # no time zone
    ({"at": "future"}, "invalid_frame"),
    ({"at": "past"}, "invalid_frame"),
    ({"id": ""}, "invalid_frame"),
    ({"signature": "forged"}, "bad_signature"),
])
async def test_a_bad_or_forged_report_is_refused_and_nothing_is_stored(make_device: Any, change: dict[str, Any], code: str) -> None:
    phone = await db_async(make_device)("phone")
    comm = await open_device(phone)
    try:
        frame = signed_report(phone, comm.yimi_nonce, *HOME)
        if change.get("at") in ("future", "past"):  # signed correctly, but outside the time window
            at = timezone.now() + (timedelta(minutes=10) if change["at"] == "future" else -timedelta(days=8))
            frame = signed_report(phone, comm.yimi_nonce, *HOME, at=at.isoformat())
        elif "signature" in change:
            other = await db_async(make_device)("phone")  # signed, but by another device's key
            frame = signed_report(phone, comm.yimi_nonce, *HOME, key_of=other)
        else:
            frame.update(change)
        await comm.send_json_to(frame)
        answer = await receive_until(comm, "location.report.ok", "error")
        assert (answer["type"], answer.get("code")) == ("error", code), answer
    finally:
        await comm.disconnect()
    assert not await db_async(LocationReport.objects.exists)()


@pytest.mark.django_db(transaction=True)
async def test_a_report_signed_for_another_connection_is_refused(make_device: Any) -> None:
    phone = await db_async(make_device)("phone")
    comm = await open_device(phone)
    try:
        await comm.send_json_to(signed_report(phone, "an-earlier-connections-nonce", *HOME))
        assert (await receive_until(comm, "location.report.ok", "error"))["code"] == "bad_signature"
    finally:
        await comm.disconnect()
    assert not await db_async(LocationReport.objects.exists)()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind,guest", [("phone", True), ("watch", False), ("glasses", False)])
async def test_only_the_owners_own_phone_reports_a_location(make_device: Any, kind: str, guest: bool) -> None:
    sim = await db_async(device_of_kind)(make_device, kind, guest=guest)
    comm = await open_device(sim)
    try:
        answer = await report(comm, sim, *HOME)
        assert (answer["type"], answer.get("code")) == ("error", "forbidden"), answer
    finally:
        await comm.disconnect()
    assert not await db_async(LocationReport.objects.exists)()


# --- geofences: fire once per entry, over a real websocket ------------------------------------------


def home_with_fence(owner: Any, *, repeat: bool) -> Watch:
    location.set_place(owner.pk, "家", lat=HOME[0], lon=HOME[1], radius_m=150)
    return geofences.create_geofence(owner, "家", repeat=repeat)


async def next_notice(comm: Any) -> dict[str, Any]:
    """The next watch notice this socket received (it may have come before the report's answer)."""
    kept = comm.__dict__.setdefault("yimi_notices", [])
    if kept:
        return kept.pop(0)
    while True:
        frame = await receive_until(comm, "notice")
        if frame.get("code") == "watch":
            return frame


@pytest.mark.django_db(transaction=True)
async def test_entering_home_fires_the_geofence_exactly_once_per_entry(make_device: Any, owner: Any) -> None:
    phone = await db_async(make_device)("phone")
    comm = await open_device(phone)
    try:
        await report(comm, phone, *AWAY)  # a report must exist to bind the fence to its phone
        fence = await db_async(home_with_fence)(owner, repeat=True)
        assert fence.last_state == "outside" and fence.once is False
        assert (await report(comm, phone, *NEAR_HOME))["geofence_notices"] == 1
        first = await next_notice(comm)
        assert "家" in first["text"] and first["notice_id"]
        assert (await report(comm, phone, *HOME))["geofence_notices"] == 0  # still inside: nothing new
        assert (await report(comm, phone, *AWAY, accuracy_m=5000))["geofence_notices"] == 0  # too coarse to tell
        assert await db_async(lambda: Watch.objects.get(id=fence.id).last_state)() == "inside"
        assert (await report(comm, phone, *AWAY))["geofence_notices"] == 0  # leaving
        assert (await report(comm, phone, *HOME))["geofence_notices"] == 1  # a repeating fence fires again
        assert (await next_notice(comm))["notice_id"] != first["notice_id"]
    finally:
        await comm.disconnect()
    assert await db_async(WatchNotice.objects.filter(watch_id=fence.id).count)() == 2


@pytest.mark.django_db(transaction=True)
async def test_a_one_time_fence_fires_once_and_ends_when_its_notice_is_acked(make_device: Any, owner: Any) -> None:
    phone = await db_async(make_device)("phone")
    comm = await open_device(phone)
    try:
        await report(comm, phone, *AWAY)
        fence = await db_async(home_with_fence)(owner, repeat=False)
        assert (await report(comm, phone, *HOME))["geofence_notices"] == 1
        notice = await next_notice(comm)
        await report(comm, phone, *AWAY)
        assert (await report(comm, phone, *HOME))["geofence_notices"] == 0  # once: no second arrival notice
        assert await db_async(lambda: Watch.objects.get(id=fence.id).active)() is True
        await comm.send_json_to({"type": "ack", "seq": notice["seq"], "status": "rendered"})
        for _ in range(100):  # the ACK is handled on the server's own time
            if not await db_async(lambda: Watch.objects.get(id=fence.id).active)():
                break
            await asyncio.sleep(0.1)
        assert await db_async(lambda: Watch.objects.get(id=fence.id).active)() is False
    finally:
        await comm.disconnect()
    assert await db_async(WatchNotice.objects.filter(watch_id=fence.id).count)() == 1


@pytest.mark.django_db
def test_a_fence_made_while_at_home_fires_only_after_leaving_and_coming_back(make_device: Any, owner: Any) -> None:
    phone = make_device("phone")
    nonce = "n" * 16
    location.record_report(phone.device, nonce, signed_report(phone, nonce, *HOME))
    fence = home_with_fence(owner, repeat=False)
    assert fence.last_state == "inside"

    def arrive(point: tuple[float, float]) -> int:
        stored = location.record_report(phone.device, nonce, signed_report(phone, nonce, *point))
        return len(geofences.on_location_report(stored.report))

    assert arrive(HOME) == 0
    assert arrive(AWAY) == 0
    assert arrive(HOME) == 1


@pytest.mark.django_db
def test_a_late_report_of_an_earlier_moment_does_not_move_a_fence(make_device: Any, owner: Any) -> None:
    phone = make_device("phone")
    nonce = "n" * 16
    location.record_report(phone.device, nonce, signed_report(phone, nonce, *AWAY))
    fence = home_with_fence(owner, repeat=True)
    late = location.record_report(phone.device, nonce, signed_report(phone, nonce, *HOME, at=(timezone.now() - timedelta(hours=1)).isoformat()))
    assert geofences.on_location_report(late.report) == []
    assert Watch.objects.get(id=fence.id).last_state == "outside"


@pytest.mark.django_db
def test_the_fallback_check_reads_the_same_state_through_the_where_tool(owner: Any, make_device: Any) -> None:
    """The watch is an ordinary watch of location__where: its receipt's content.place.state."""
    phone = make_device("phone")
    location.record_report(phone.device, "n" * 16, signed_report(phone, "n" * 16, *AWAY))
    fence = home_with_fence(owner, repeat=False)
    assert (fence.tool, fence.arguments, fence.state_path) == ("location__where", {"place": "家"}, "content.place.state")
    assert (fence.s_from, fence.s_to, fence.interval_seconds) == ("outside", "inside", geofences.FALLBACK_INTERVAL_SECONDS)
    receipt = {"status": "succeeded", "content": {"place": {"name": "家", "state": "inside"}}}
    assert watches.read_state(receipt, fence.state_path) == "inside"
    assert watches.read_state({"content": {"place": {"state": None}}}, fence.state_path) is None  # unknown changes nothing


# --- places and the internal endpoints ---------------------------------------------------------------


@pytest.mark.django_db
def test_places_are_bounded_and_unique_by_name(owner: Any) -> None:
    place, created = location.set_place(owner.pk, "  公司 ", lat=31.2304, lon=121.4737)
    assert (place.name, created, place.radius_m) == ("公司", True, location.DEFAULT_RADIUS_M)
    moved, created = location.set_place(owner.pk, "公司", lat=31.24, lon=121.5, radius_m=300)
    assert (moved.id, created, moved.radius_m) == (place.id, False, 300)
    for bad in ({"lat": 91, "lon": 0}, {"lat": 0, "lon": 0, "radius_m": 5}, {"lat": 0, "lon": 0, "radius_m": 60_000}, {"lat": "1", "lon": 0}):
        with pytest.raises(YimiError) as refused:
            location.set_place(owner.pk, "公司", **bad)
        assert refused.value.code == "invalid_request"
    with pytest.raises(YimiError) as nowhere:
        location.set_place(owner.pk, "这里", here=True)
    assert nowhere.value.code == "no_location"
    assert list(Place.objects.values_list("name", "lat", "radius_m")) == [("公司", 31.24, 300)]


def internal(owner: Any, category: str, *, apis: list[str] | None = None, tool: str = "location__places", **target: Any) -> Any:
    return internal_client(**{CAP: pack_capability(owner.pk, pack="location", category=category, apis=apis or ["location"], tool=tool, **target)})


@pytest.mark.django_db
def test_the_internal_place_endpoints_need_an_owner_data_call_on_the_same_name(owner: Any) -> None:
    url = "/internal/location/places/"
    body = {"action": "set", "name": "家", "lat": HOME[0], "lon": HOME[1]}
    observe = internal(owner, "observe").post(url, body, content_type="application/json")
    assert (observe.status_code, observe.json()["error"]["code"]) == (403, "forbidden")
    other = internal(owner, "owner_data", name="公司").post(url, body, content_type="application/json")
    assert other.status_code == 403
    no_api = internal(owner, "owner_data", apis=["memory"], name="家").post(url, body, content_type="application/json")
    assert no_api.status_code == 403
    # another tool's owner_data call (its target is a place, not a name) may not set places
    other_tool = internal(owner, "owner_data", tool="location__notify_arrival", place="家").post(url, body, content_type="application/json")
    assert (other_tool.status_code, other_tool.json()["error"]["code"]) == (403, "forbidden")
    assert not Place.objects.exists()
    made = internal(owner, "owner_data", name="家").post(url, body, content_type="application/json")
    assert made.status_code == 200 and made.json()["created"] is True
    listed = internal(owner, "observe").post(url, {"action": "list"}, content_type="application/json").json()
    assert [p["name"] for p in listed["places"]] == ["家"]
    public = internal_client().post(url, {"action": "list"}, content_type="application/json")
    assert public.status_code == 403


@pytest.mark.django_db
def test_a_geofence_is_created_only_by_an_owner_data_call_on_an_existing_place(owner: Any, make_device: Any) -> None:
    url = "/internal/location/geofences/"
    phone = make_device("phone")
    location.record_report(phone.device, "n" * 16, signed_report(phone, "n" * 16, *AWAY))
    nowhere = internal(owner, "owner_data", tool="location__notify_arrival", place="家").post(
        url, {"action": "create", "place": "家"}, content_type="application/json")
    assert (nowhere.status_code, nowhere.json()["error"]["code"]) == (404, "not_found")
    location.set_place(owner.pk, "家", lat=HOME[0], lon=HOME[1])
    observe = internal(owner, "observe", tool="location__notify_arrival").post(url, {"action": "create", "place": "家"}, content_type="application/json")
    assert observe.status_code == 403 and not Watch.objects.exists()
    made = internal(owner, "owner_data", tool="location__notify_arrival", place="家").post(
        url, {"action": "create", "place": "家", "repeat": True}, content_type="application/json").json()["geofence"]
    watch = Watch.objects.get(id=made["watch_id"])
    assert (watch.device_id, watch.once, made["repeat"]) == (phone.device.id, False, True)
    cancel = internal(owner, "owner_data", tool="location__geofences", watch_id=made["watch_id"]).post(
        url, {"action": "cancel", "watch_id": made["watch_id"]}, content_type="application/json").json()
    assert cancel["cancelled"] is True and Watch.objects.get(id=watch.id).active is False


# --- the pack: manifest, contract, gateway -----------------------------------------------------------


def test_the_manifest_declares_five_tools_with_writes_as_owner_data() -> None:
    pack = load_pack(PACK)
    tools = pack.tools
    assert sorted(tools) == ["distance", "geofences", "notify_arrival", "places", "where"]
    assert tools["where"].resolve_category({}) == "observe" and tools["distance"].resolve_category({}) == "observe"
    assert [tools["places"].resolve_category({"action": a}) for a in ("list", "set", "remove")] == ["observe", "owner_data", "owner_data"]
    assert tools["notify_arrival"].resolve_category({"place": "家"}) == "owner_data"
    assert [tools["geofences"].resolve_category({"action": a}) for a in ("list", "cancel")] == ["observe", "owner_data"]
    assert pack.platform_api == ["location"] and pack.enabled_by_default


def test_the_location_contract_passes_on_the_fake() -> None:
    report = run_contract(PACK, fake=True)
    assert report.passed, report_text(report)
    assert len(report.cases) == 5


@pytest.mark.django_db(transaction=True)
def test_pack_contract_location_both_against_the_platform(internal_listener: Any, owner: Any) -> None:
    from django.core.management import call_command

    out = io.StringIO()
    call_command("pack_contract", "location", "--both", "--against-live", stdout=out)
    text = out.getvalue()
    assert "location  real  pass" in text and "location  fake  pass" in text and "2/2 contract runs passed" in text, text
    assert not Place.objects.exists()  # the real run removed the place it made


@pytest.mark.django_db(transaction=True)
def test_places_through_the_gateway_a_write_the_owner_did_not_request_asks_a_card(internal_listener: Any, make_device: Any) -> None:
    from capabilities.client import call_tool
    from capabilities.mcp_host import runtime
    from consent.models import ConsentCard

    runtime.reset_for_tests()
    try:
        run_id = str(accept_utterance(make_device().device, new_client_id(), "把这里记成家").run_id)
        args = {"action": "set", "name": "家", "lat": HOME[0], "lon": HOME[1]}
        asked = asyncio.run(call_tool(run_id, "", "location__places", args))
        assert (asked.decision, asked.executed) == ("ask", False)
        assert ConsentCard.objects.get(call_id=asked.call_id).category == "owner_data"
        assert not Place.objects.exists()
        # the same write, asked for by the owner in this request (another place: 家 is waiting on its card)
        done = asyncio.run(call_tool(run_id, "", "location__places", {**args, "name": "公司", "owner_requested": True}))
        assert done.executed and done.receipt is not None and done.receipt["status"] == "succeeded", done.model_text
        assert done.receipt["effects"][0]["target"] == "place:公司"
        assert list(Place.objects.values_list("name", "lat", "lon")) == [("公司", HOME[0], HOME[1])]
        listed = asyncio.run(call_tool(run_id, "", "location__places", {"action": "list"}))
        assert listed.decision == "allow" and listed.receipt["content"]["items"][0]["name"] == "公司"
        removed = asyncio.run(call_tool(run_id, "", "location__places", {"action": "remove", "name": "公司", "owner_requested": True}))
        assert removed.receipt["status"] == "succeeded" and not Place.objects.exists()
    finally:
        runtime.reset_for_tests()


# --- the owner's console -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_reports_and_places_have_read_only_owner_pages(owner: Any, make_device: Any, django_user_model: Any) -> None:
    phone = make_device("phone")
    location.record_report(phone.device, "n" * 16, signed_report(phone, "n" * 16, *HOME))
    location.set_place(owner.pk, "家", lat=HOME[0], lon=HOME[1])
    mine = logged_in(owner)
    assert "39.9087" in mine.get("/admin/memory/locationreport/").content.decode()
    assert "家" in mine.get("/admin/memory/place/").content.decode()
    place = Place.objects.get()
    assert mine.get("/admin/memory/place/add/").status_code == 403
    assert mine.post(f"/admin/memory/place/{place.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Place.objects.exists()
    second = logged_in(django_user_model.objects.create_superuser("second-admin", password="pw-pw-pw-pw"))
    for url in ("/admin/memory/locationreport/", "/admin/memory/place/", f"/admin/memory/place/{place.pk}/change/"):
        assert second.get(url).status_code == 403


@pytest.mark.django_db
def test_a_geofence_from_a_run_is_bound_to_the_runs_device(owner: Any, make_device: Any) -> None:
    glasses = make_device("glasses")
    run_id = accept_utterance(glasses.device, new_client_id(), "到家了提醒我拿快递").run_id
    location.set_place(owner.pk, "家", lat=HOME[0], lon=HOME[1])
    fence = geofences.create_geofence(owner, "家", run_key=str(run_id))
    assert (fence.device_id, fence.last_state, fence.once) == (glasses.device.id, "", True)  # no report yet: nothing known
    with pytest.raises(YimiError) as unbound:  # no run and no report: nothing to bind the watch to
        geofences.create_geofence(owner, "家", run_key="contract-run")
    assert unbound.value.code == "no_location"
