"""Scheduled runs and watches ("快递到了告诉我"): schedules fired by beat into real runs
with ``origin=scheduled``, watches that call a pack tool through the gateway and notify
once when its state moves, pending notices cleared only by a device's ACK, and the
``delivery`` pack against a local fake carrier speaking real HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capabilities.egress import Rule
from capabilities.manifest import load_pack
from capabilities.mcp_host.sandbox import PlatformPaths, grant_for
from tests.support.parcel_service import ParcelService

PACKS = Path(__file__).resolve().parents[2] / "packs"


def report_text(report: Any) -> str:
    lines = [f"{report.pack} ({report.implementation}): errors={report.errors}"]
    for case in report.cases:
        lines.append(f"  {'pass' if case.passed else 'FAIL'} {case.name}")
        lines.extend(f"      {f}" for f in case.failures)
    return "\n".join(lines)


def secrets_with_url(root: Path, url: str) -> Path:
    secrets = root / "secrets"
    secrets.mkdir(exist_ok=True)
    (secrets / "PARCELS_API_URL").write_text(url + "\n", encoding="utf-8")
    return secrets


# --- the delivery pack (track) -----------------------------------------------------------------------


def test_the_delivery_manifest_declares_its_secret_and_egress(tmp_path: Path) -> None:
    pack = load_pack(PACKS / "delivery")
    assert (pack.secrets, pack.host, pack.tools["track"].resolve_category({})) == (["PARCELS_API_URL"], "dedicated", "observe")
    assert pack.platform_api == ["watches"]
    assert pack.egress == [{"url_secret": "PARCELS_API_URL", "why": "the carrier tracking service"}]
    paths = PlatformPaths(tmp_path, tmp_path / "w", tmp_path / "m", secrets_with_url(tmp_path, "http://carrier.test"), None)
    grant = grant_for([pack], paths)
    # the egress proxy lets it reach the URL's host and port, nothing else
    assert grant.egress == [Rule("carrier.test", 80, "tcp")] and grant.env == {"PARCELS_API_URL": "http://carrier.test"}


# The delivery pack's contracts (real against a fake carrier and the platform, and fake),
# follow, list and the gateway's card: tests/schedules/test_delivery_pack.py.


# --- schedules and watches --------------------------------------------------------------------

from collections.abc import Iterator  # noqa: E402
from datetime import timedelta  # noqa: E402

import pytest  # noqa: E402
from django.utils import timezone  # noqa: E402

from brain.models import Run  # noqa: E402
from capabilities.mcp_host import runtime  # noqa: E402
from capabilities.services import CallRequest, decide  # noqa: E402
from consent.models import ConsentCard  # noqa: E402
from devices.services import record_delivery  # noqa: E402
from memory.models import TimelineEntry  # noqa: E402
from schedules import schedules, watches  # noqa: E402
from schedules.models import WatchNotice  # noqa: E402
from tests.support.gateway_support import copy_repo_pack  # noqa: E402


@pytest.fixture
def carrier(tmp_path: Path, settings: Any) -> Iterator[ParcelService]:
    """The repo's delivery and messaging packs, the carrier's URL as the declared secret."""
    packs = tmp_path / "packs"
    packs.mkdir()
    copy_repo_pack(packs, "delivery")
    copy_repo_pack(packs, "messaging")
    with ParcelService() as service:
        settings.YIMI_PACKS_DIR = packs
        settings.SECRETS_DIR = secrets_with_url(tmp_path, service.url)
        settings.YIMI_MAIL_DIR = tmp_path / "mail"
        runtime.reset_for_tests()
        yield service
        runtime.reset_for_tests()


def parcel_watch(owner: Any, device: Any, now: Any) -> Any:
    return watches.create_watch(
        owner, device, label="快递 YT1", tool="delivery__track", arguments={"tracking_number": "YT1"},
        s_from="in_transit", s_to="delivered", interval_seconds=600, now=now,
    )


@pytest.mark.django_db(transaction=True)
def test_a_watch_notifies_exactly_once_when_the_parcel_is_delivered(owner: Any, make_device: Any, carrier: ParcelService) -> None:
    phone = make_device("phone")
    now = timezone.now()
    watch = parcel_watch(owner, phone.device, now)
    carrier.set_state("YT1", "in_transit")
    for i in range(3):
        check = watches.check_watch(watch.id, now=now + timedelta(minutes=10 * i))
        assert (check.state, check.notice) == ("in_transit", None)
    carrier.set_state("YT1", "delivered")
    first = watches.check_watch(watch.id, now=now + timedelta(minutes=40))
    assert first.state == "delivered" and first.notice is not None
    notice_id = first.notice.id
    # no ACK: the next check sends the same notice again (once), and writes no second one
    again = watches.check_watch(watch.id, now=now + timedelta(minutes=50))
    assert (again.notice, again.resent) == (None, [notice_id])
    pending = WatchNotice.objects.get()
    assert (pending.id, pending.state, pending.sends) == (notice_id, WatchNotice.State.PENDING, 2)
    # the device ACKs the entry through the delivery path: delivered, never sent again
    record_delivery(phone.device, pending.entry.seq, "rendered")
    for i in range(2):
        later = watches.check_watch(watch.id, now=now + timedelta(minutes=60 + 10 * i))
        assert (later.state, later.notice, later.resent) == ("delivered", None, [])
    done = WatchNotice.objects.get()
    assert (done.state, done.sends) == (WatchNotice.State.DELIVERED, 2) and done.delivered_at is not None
    notices = TimelineEntry.objects.filter(notice_code="watch")
    assert [e.text for e in notices] == ["📦 快递 YT1: delivered"]
    # every check was a real scheduled run that went through the gateway to the carrier
    runs = Run.objects.filter(origin=Run.Origin.SCHEDULED)
    assert runs.count() == 7 and set(runs.values_list("state", flat=True)) == {Run.State.SUCCEEDED}
    assert carrier.hits["YT1"] == 7


@pytest.mark.django_db(transaction=True)
def test_a_failed_push_leaves_the_notice_pending_and_the_next_check_resends_the_same_id(
    owner: Any, make_device: Any, carrier: ParcelService, settings: Any
) -> None:
    phone = make_device("phone")
    now = timezone.now()
    watch = parcel_watch(owner, phone.device, now)
    carrier.set_state("YT1", "delivered")
    # the channel layer is a Redis nobody listens on: the push fails after the row is written
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": ["redis://127.0.0.1:9/0"]}}}
    first = watches.check_watch(watch.id, now=now)
    assert first.notice is not None
    assert (WatchNotice.objects.get().state, WatchNotice.objects.get().sends) == (WatchNotice.State.PENDING, 0)
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    again = watches.check_watch(watch.id, now=now + timedelta(minutes=10))
    assert (again.notice, again.resent) == (None, [first.notice.id])
    assert WatchNotice.objects.count() == 1 and WatchNotice.objects.get().sends == 1


@pytest.mark.django_db(transaction=True)
def test_an_unknown_check_never_notifies(owner: Any, make_device: Any, carrier: ParcelService) -> None:
    phone = make_device("phone")
    watch = parcel_watch(owner, phone.device, timezone.now())
    check = watches.check_watch(watch.id)  # YT1 unknown to the carrier: failed, no state
    assert (check.state, check.notice) == (None, None)
    assert WatchNotice.objects.count() == 0 and Run.objects.get().state == Run.State.FAILED


@pytest.mark.django_db(transaction=True)
def test_a_due_schedule_becomes_one_scheduled_run(owner: Any, make_device: Any) -> None:
    phone = make_device("phone")
    now = timezone.now()
    made = schedules.create_schedule(owner, phone.device, "总结今天的日程", interval_seconds=3600, now=now)
    assert schedules.fire_due_schedules(now=now + timedelta(minutes=30)) == []
    [run_id] = schedules.fire_due_schedules(now=now + timedelta(minutes=61))
    assert schedules.fire_due_schedules(now=now + timedelta(minutes=61)) == []  # claimed once
    run = Run.objects.select_related("inbound").get(id=run_id)
    assert (run.origin, run.state, run.scope, run.inbound.text, run.inbound.notice_code) == ("scheduled", "queued", "owner", "总结今天的日程", "scheduled")
    made.refresh_from_db()
    assert made.next_run_at == now + timedelta(hours=2) and made.last_run_id == run_id
    assert schedules.cancel_schedule(owner, made.id)
    assert schedules.fire_due_schedules(now=now + timedelta(hours=5)) == []


@pytest.mark.django_db(transaction=True)
def test_a_scheduled_run_that_would_need_a_card_is_blocked(owner: Any, make_device: Any, carrier: ParcelService) -> None:
    phone = make_device("phone")
    now = timezone.now()
    schedules.create_schedule(owner, phone.device, "给小林发晚安", interval_seconds=3600, now=now)
    [run_id] = schedules.fire_due_schedules(now=now + timedelta(hours=1))
    args = {"to": "xiaolin@example.com", "subject": "晚安", "body": "晚安", "action": "send", "owner_requested": True}
    blocked = decide(CallRequest(str(run_id), "messaging__send", args))
    assert (blocked.decision, blocked.code) == ("block", "needs_confirmation_in_scheduled_task")
    assert ConsentCard.objects.count() == 0
    assert decide(CallRequest(str(run_id), "delivery__track", {"tracking_number": "YT1"})).decision == "allow"  # reads still run


def test_the_beat_tasks_are_registered_under_their_schedule_names(settings: Any) -> None:
    from yimi_project.celery import app

    app.loader.import_default_modules()
    for entry, task in (("fire-due-schedules", "brain.tasks.fire_due_schedules"), ("run-due-watches", "brain.tasks.run_due_watches")):
        assert settings.CELERY_BEAT_SCHEDULE[entry]["task"] == task
        assert task in app.tasks
