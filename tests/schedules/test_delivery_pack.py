"""The ``delivery`` pack: track a parcel at the carrier (a local fake carrier speaking real
HTTP, tests/support/parcel_service.py), follow it (a one-time watch of ``delivery__track`` made
through ``/internal/watches/parcels/``, platform API ``watches``), list and stop following,
through the gateway and over the contract."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from brain.services import accept_utterance
from capabilities.contract import run_contract
from capabilities.manifest import load_pack
from capabilities.mcp_host import runtime
from memory.models import TimelineEntry
from schedules import parcels, watches
from schedules.models import Watch, WatchNotice
from tests.conftest import internal_client, new_client_id, pack_capability
from tests.schedules.test_watches import report_text, secrets_with_url
from tests.support.gateway_support import copy_repo_pack
from tests.support.parcel_service import ParcelService
from yimi_project.call_capability import HEADER as CAP

PACK = Path(__file__).resolve().parents[2] / "packs" / "delivery"
URL = "/internal/watches/parcels/"


def test_the_manifest_declares_three_tools_with_follow_as_owner_data() -> None:
    pack = load_pack(PACK)
    assert sorted(pack.tools) == ["follow", "list", "track"]
    assert [pack.tools[t].resolve_category({}) for t in ("track", "list")] == ["observe", "observe"]
    assert [pack.tools["follow"].resolve_category({"tracking_number": "YT1", "stop": s}) for s in (False, True)] == ["owner_data", "owner_data"]
    assert pack.tools["follow"].target_arguments({"tracking_number": "YT1"}) == {"tracking_number": "YT1"}
    assert (pack.platform_api, pack.secrets, pack.enabled_by_default) == (["watches"], ["PARCELS_API_URL"], True)


def test_the_delivery_contract_passes_on_the_fake() -> None:
    report = run_contract(PACK, fake=True)
    assert report.passed, report_text(report)
    assert len(report.cases) == 6 and report.skipped == ["an unreachable carrier is DISCONNECTED, never a state"]


@pytest.mark.django_db(transaction=True)
def test_pack_contract_delivery_both_against_a_fake_carrier_and_the_platform(
    internal_listener: Any, owner: Any, make_device: Any, settings: Any, tmp_path: Path
) -> None:
    from django.core.management import call_command

    phone = make_device("phone")  # the real follow binds its watch to the owner's device
    with ParcelService() as carrier:
        settings.SECRETS_DIR = secrets_with_url(tmp_path, carrier.url)
        out = io.StringIO()
        call_command("pack_contract", "delivery", "--both", "--against-live", stdout=out)
        text = out.getvalue()
        assert "delivery  real  pass" in text and "delivery  fake  pass" in text and "2/2 contract runs passed" in text, text
        assert "FAIL" not in text and carrier.hits["CONTRACT-1"] >= 3 and carrier.hits["NO-SUCH-PARCEL"] == 2  # it really asked
    made = Watch.objects.get()  # one follow, stopped again; the delivered and unknown ones made none
    assert (made.tool, made.arguments, made.device_id, made.active, made.once) == (
        "delivery__track", {"tracking_number": "CONTRACT-1"}, phone.device.id, False, True)


def internal(owner: Any, category: str, *, apis: list[str] | None = None, **target: Any) -> Any:
    return internal_client(**{CAP: pack_capability(owner.pk, pack="delivery", category=category, apis=apis or ["watches"],
                                                   tool="delivery__follow", **target)})


@pytest.mark.django_db
def test_the_internal_endpoint_follows_only_for_an_owner_data_call_on_the_same_number(owner: Any, make_device: Any) -> None:
    phone = make_device("phone")
    body = {"action": "follow", "tracking_number": "YT1", "state": "not_delivered"}
    for refused in (internal(owner, "observe"), internal(owner, "owner_data", tracking_number="YT2"),
                    internal(owner, "owner_data", apis=["location"], tracking_number="YT1"), internal_client()):
        answer = refused.post(URL, body, content_type="application/json")
        assert (answer.status_code, answer.json()["error"]["code"]) == (403, "forbidden")
    for bad in ({**body, "tracking_number": ""}, {**body, "state": "delivered"}, {**body, "action": "explode"}, {**body, "label": 5}):
        answer = internal(owner, "owner_data", tracking_number="YT1").post(URL, bad, content_type="application/json")
        assert (answer.status_code, answer.json()["error"]["code"]) == (400, "invalid_request"), bad
    assert not Watch.objects.exists()
    made = internal(owner, "owner_data", tracking_number="YT1").post(URL, body, content_type="application/json").json()
    again = internal(owner, "owner_data", tracking_number="YT1").post(URL, body, content_type="application/json").json()
    assert (made["created"], again["created"], again["parcel"]["watch_id"]) == (True, False, made["parcel"]["watch_id"])
    watch = Watch.objects.get()
    assert (watch.device_id, watch.state_path, watch.s_from, watch.s_to, watch.last_state) == (
        phone.device.id, "content.arrival", "not_delivered", "delivered", "not_delivered")
    listed = internal(owner, "observe").post(URL, {"action": "list"}, content_type="application/json").json()["parcels"]
    assert [(p["tracking_number"], p["label"], p["last_state"]) for p in listed] == [("YT1", "快递 YT1", "not_delivered")]
    stopped = internal(owner, "owner_data", tracking_number="YT1").post(URL, {"action": "unfollow", "tracking_number": "YT1"},
                                                                         content_type="application/json").json()
    assert stopped["stopped"] == [str(watch.id)] and not Watch.objects.get().active
    never = internal(owner, "owner_data", tracking_number="YT3").post(URL, {"action": "unfollow", "tracking_number": "YT3"},
                                                                       content_type="application/json")
    assert (never.status_code, never.json()["error"]["code"]) == (404, "not_found")


@pytest.fixture
def carrier(tmp_path: Path, settings: Any, internal_listener: Any) -> Iterator[ParcelService]:
    """The repo's delivery pack with the carrier's URL as its secret, and the platform socket."""
    packs = tmp_path / "packs"
    packs.mkdir()
    copy_repo_pack(packs, "delivery")
    with ParcelService() as service:
        settings.YIMI_PACKS_DIR = packs
        settings.SECRETS_DIR = secrets_with_url(tmp_path, service.url)
        runtime.reset_for_tests()
        yield service
        runtime.reset_for_tests()


def call(run_id: str, tool: str, args: dict[str, Any]) -> Any:
    from capabilities.client import call_tool

    return asyncio.run(call_tool(run_id, "", tool, args))


@pytest.mark.django_db(transaction=True)
def test_a_followed_parcel_notifies_exactly_once_when_delivered_and_list_and_stop_work(
    make_device: Any, owner: Any, carrier: ParcelService
) -> None:
    from consent.models import ConsentCard
    from devices.services import record_delivery

    phone = make_device("phone")
    run_id = str(accept_utterance(phone.device, new_client_id(), "快递 YT9 到了告诉我").run_id)
    carrier.set_state("YT9", "in_transit")
    carrier.set_state("YT10", "out_for_delivery")
    # a follow the owner did not ask for in this request waits on a card and follows nothing
    asked = call(run_id, "delivery__follow", {"tracking_number": "YT10"})
    assert (asked.decision, asked.executed) == ("ask", False)
    assert ConsentCard.objects.get(call_id=asked.call_id).category == "owner_data" and not Watch.objects.exists()
    done = call(run_id, "delivery__follow", {"tracking_number": "YT9", "owner_requested": True})
    assert done.executed and done.receipt["status"] == "succeeded", done.model_text
    watch = Watch.objects.get()
    assert done.receipt["effects"][0]["target"] == f"watch:{watch.id}" and watch.device_id == phone.device.id
    listed = call(run_id, "delivery__list", {})
    assert listed.decision == "allow" and [(p["tracking_number"], p["last_state"]) for p in listed.receipt["content"]["items"]] == [("YT9", "not_delivered")]
    now = timezone.now()
    carrier.set_state("YT9", "out_for_delivery")  # any state but delivered is not_delivered: no notice
    assert (watches.check_watch(watch.id, now=now).state, WatchNotice.objects.count()) == ("not_delivered", 0)
    carrier.set_state("YT9", "delivered")
    first = watches.check_watch(watch.id, now=now + deliveries_interval(1))
    assert first.state == "delivered" and first.notice is not None
    assert watches.check_watch(watch.id, now=now + deliveries_interval(2)).notice is None  # delivered stays delivered: no second
    notice = WatchNotice.objects.get()
    assert [e.text for e in TimelineEntry.objects.filter(notice_code="watch")] == ["📦 快递 YT9: delivered"]
    record_delivery(phone.device, notice.entry.seq, "rendered")  # the ACK ends the one-time watch
    assert not Watch.objects.get(id=watch.id).active
    assert call(run_id, "delivery__list", {}).receipt["content"]["items"] == []
    # following again and stopping: the stop ends the new watch, which never notifies
    carrier.set_state("YT11", "in_transit")
    again = call(run_id, "delivery__follow", {"tracking_number": "YT11", "owner_requested": True})
    new = Watch.objects.get(arguments__tracking_number="YT11")
    stop = call(run_id, "delivery__follow", {"tracking_number": "YT11", "stop": True, "owner_requested": True})
    assert again.receipt["status"] == stop.receipt["status"] == "succeeded", stop.model_text
    assert stop.receipt["effects"][0] == {**stop.receipt["effects"][0], "target": f"watch:{new.id}", "action": "cancel"}
    assert not Watch.objects.get(id=new.id).active
    carrier.set_state("YT11", "delivered")
    assert watches.run_due_watches(now=now + deliveries_interval(10)) == 0  # nothing active is due
    assert WatchNotice.objects.count() == 1


def deliveries_interval(n: int) -> Any:
    from datetime import timedelta

    return timedelta(seconds=parcels.INTERVAL_SECONDS * n)
