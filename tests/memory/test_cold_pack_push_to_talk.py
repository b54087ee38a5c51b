"""No cold pack starts while push-to-talk is held, in any process (issue 19; docs/memory.md
"Cold packs"): the voice socket's ``push_to_talk`` frame records the hold in the database
(``devices.push_to_talk``), where a migration round — run here as the Celery worker runs
it, outside the web process's analysis scheduler — finds it through the busy check devices
registered at app ready. A lost release ends after ``PTT_HOLD_SECONDS``; a pack already
uploading when the key goes down finishes."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import pytest

from devices import push_to_talk
from devices.models import PushToTalkHold
from memory.archive import cold_store as archive
from memory.archive.models import ColdPack, ObjectLocation
from tests.conftest import db_async, receive_until
from tests.memory.test_cold_packs import T0, Clock, Now, ServerDAV, cold, hot_intact, store, three  # noqa: F401  (fixture)
from tests.support import voice_support
from tests.support.webdav_support import WsgiDAVServer, webdav  # noqa: F401  (fixture)
from tests.voice.test_voice_session import open_voice, start
from voice.ambient import PTT_HOLD_SECONDS

voice_assets = voice_support.voice_assets
voice_catalog = voice_support.voice_catalog


def test_devices_registered_the_push_to_talk_check_at_app_ready() -> None:
    assert push_to_talk.busy in archive._busy_checks


@pytest.mark.django_db(transaction=True)
async def test_a_push_to_talk_frame_stops_the_next_pack_until_the_key_is_up(
    voice_catalog: dict[str, Any], cold: WsgiDAVServer, owner: Any, make_device: Any  # noqa: F811
) -> None:
    objs = await db_async(three)(owner)
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    started = await start(comm)
    await comm.send_json_to({"type": "push_to_talk", "id": "p", "state": "down"})
    assert (await receive_until(comm, "push_to_talk.ack", "error"))["type"] == "push_to_talk.ack"
    hold = await db_async(PushToTalkHold.objects.get)()
    assert (hold.session, hold.owner_id, hold.device_id) == (started["session_id"], owner.pk, sim.device.id)
    assert hold.expires_at - hold.started_at == timedelta(seconds=PTT_HOLD_SECONDS)

    report = await db_async(archive.migrate_round)(owner.pk, clock=Clock(), now=Now())
    assert report.stopped == "busy:push_to_talk" and report.candidates == 3
    assert not await db_async(ColdPack.objects.exists)() and cold.files() == []

    await comm.send_json_to({"type": "push_to_talk", "id": "u", "state": "up"})
    assert (await receive_until(comm, "push_to_talk.ack", "error"))["state"] == "up"
    assert not await db_async(PushToTalkHold.objects.exists)()
    report = await db_async(archive.migrate_round)(owner.pk, clock=Clock(), now=Now())
    assert report.stopped == "done" and report.objects_packed == len(objs) and len(cold.files()) == 1

    # A hold whose key never came up goes with the socket.
    await comm.send_json_to({"type": "push_to_talk", "id": "p2", "state": "down"})
    await receive_until(comm, "push_to_talk.ack", "error")
    assert await db_async(PushToTalkHold.objects.count)() == 1
    await comm.disconnect()
    assert not await db_async(PushToTalkHold.objects.exists)()


@pytest.mark.django_db
def test_a_lost_release_ends_after_the_hold_time_and_other_owners_are_not_held(owner: Any, make_device: Any, django_user_model: Any) -> None:
    device = make_device().device
    push_to_talk.hold("session-1", device, now=T0)
    assert push_to_talk.busy(owner.pk, now=T0 + timedelta(seconds=PTT_HOLD_SECONDS - 1)) == "push_to_talk"
    assert push_to_talk.busy(owner.pk, now=T0 + timedelta(seconds=PTT_HOLD_SECONDS)) is None
    other = django_user_model.objects.create_user("someone-else")
    assert push_to_talk.busy(other.pk, now=T0) is None
    # A second press renews the same session's hold; an expired one is dropped at the next press.
    push_to_talk.hold("session-1", device, now=T0 + timedelta(seconds=60))
    assert PushToTalkHold.objects.get().expires_at == T0 + timedelta(seconds=60 + PTT_HOLD_SECONDS)
    push_to_talk.hold("session-2", device, now=T0 + timedelta(seconds=60 + PTT_HOLD_SECONDS))
    assert list(PushToTalkHold.objects.values_list("session", flat=True)) == ["session-2"]
    assert push_to_talk.release("session-2") and not push_to_talk.release("session-2")


@pytest.mark.django_db
def test_a_pack_uploading_when_the_key_goes_down_finishes_and_no_next_one_starts(cold: WsgiDAVServer, owner: Any, make_device: Any) -> None:  # noqa: F811
    objs = [store(owner, os.urandom(4000), "image/jpeg", "image") for _ in range(4)]
    device = make_device().device
    dav = ServerDAV(cold, after_put=lambda path: push_to_talk.hold("session-ptt", device))
    report = archive.migrate_round(owner.pk, clock=Clock(), now=Now(), dav=dav, seal_bytes=8000)
    assert report.stopped == "busy:push_to_talk" and len(report.packs_verified) == 1 and dav.puts == 1
    assert ObjectLocation.objects.count() == 2 and hot_intact(*objs)
