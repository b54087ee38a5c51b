from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator

from accounts import devices as device_identity
from accounts.devices import revoke_device
from accounts.models import AdmissionRecord, Device
from accounts.signatures import auth_message, challenge_message, verify
from brain.models import Run
from devices import services as device_services
from devices.consumers.device import DeviceConsumer
from devices.models import Delivery
from memory.models import TimelineEntry
from memory.timeline.entries import append_entry
from tests.conftest import SOCKET_TIMEOUT, SimDevice, db_async, new_client_id, new_keypair, open_socket, receive_until, script
from yimi_project import push

pytestmark = pytest.mark.django_db(transaction=True)
SOCKETS = ["/ws/device/", "/ws/voice/"]


@pytest.fixture
def auth_deadline(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """The handshake's clock in the test's hands: the auth deadline passes when the test
    sets this event, not when some wall-clock time has gone by."""
    passes = asyncio.Event()

    async def wait(seconds: float) -> None:
        await passes.wait()

    monkeypatch.setattr(DeviceConsumer, "wait_auth_deadline", staticmethod(wait))
    return passes


def auth_frame(sim: SimDevice, challenge: dict[str, Any]) -> dict[str, Any]:
    return {"type": "auth", "device_id": str(sim.device.id), "signature": sim.sign(auth_message(challenge["nonce"], str(sim.device.id)))}


async def test_challenge_is_signed_by_the_instance_key(owner: Any) -> None:
    comm, challenge = await open_socket(authenticate=False)
    assert challenge["protocol"] == 1
    assert verify(challenge["server_key"], challenge_message(challenge["nonce"]), challenge["server_signature"])
    await comm.disconnect()


async def test_device_authenticates_by_signing_the_nonce(make_device: Any) -> None:
    sim = await db_async(make_device)()
    comm, ready = await open_socket(sim)
    assert ready["device_id"] == str(sim.device.id) and ready["scope"] == "owner" and ready["last_seq"] == 0
    await comm.disconnect()


async def test_wrong_signature_closes_with_4401(make_device: Any) -> None:
    sim, other = await db_async(make_device)(), await db_async(make_device)()
    comm, challenge = await open_socket(authenticate=False)
    forged = other.sign(auth_message(challenge["nonce"], str(sim.device.id)))
    await comm.send_json_to({"type": "auth", "device_id": str(sim.device.id), "signature": forged})
    error = await comm.receive_json_from()
    assert error == {"type": "error", "code": "bad_signature", "message": error["message"]}
    assert await comm.receive_output() == {"type": "websocket.close", "code": 4401}


async def test_signature_over_another_nonce_is_refused(make_device: Any) -> None:
    sim = await db_async(make_device)()
    comm, _ = await open_socket(authenticate=False)
    replayed = sim.sign(auth_message("an-old-nonce", str(sim.device.id)))
    await comm.send_json_to({"type": "auth", "device_id": str(sim.device.id), "signature": replayed})
    assert (await comm.receive_json_from())["code"] == "bad_signature"
    assert (await comm.receive_output())["code"] == 4401


async def test_unknown_device_closes_with_4401(owner: Any) -> None:
    comm, _ = await open_socket(authenticate=False)
    await comm.send_json_to({"type": "auth", "device_id": "00000000-0000-0000-0000-000000000000", "signature": "AAAA"})
    assert (await comm.receive_json_from())["code"] == "not_authenticated"
    assert (await comm.receive_output())["code"] == 4401


async def test_frames_before_auth_close_with_4401(make_device: Any) -> None:
    await db_async(make_device)()
    comm, _ = await open_socket(authenticate=False)
    await comm.send_json_to({"type": "text", "id": "x", "text": "hi"})
    assert (await comm.receive_json_from())["code"] == "not_authenticated"
    assert (await comm.receive_output())["code"] == 4401
    assert await db_async(TimelineEntry.objects.count)() == 0


async def test_no_auth_frame_in_time_closes_with_4408(owner: Any, auth_deadline: asyncio.Event) -> None:
    comm, _ = await open_socket(authenticate=False)
    assert await comm.receive_nothing()
    auth_deadline.set()
    assert (await comm.receive_json_from())["code"] == "auth_timeout"
    assert (await comm.receive_output())["code"] == 4408


async def test_the_auth_deadline_is_ws_auth_timeout_seconds_of_real_time(owner: Any, settings: Any) -> None:
    settings.WS_AUTH_TIMEOUT_SECONDS = 0.05  # this test's own, short: no auth frame is ever sent
    comm, _ = await open_socket(authenticate=False)
    assert (await comm.receive_json_from())["code"] == "auth_timeout"
    assert (await comm.receive_output())["code"] == 4408


async def test_an_auth_frame_in_time_is_checked_however_long_the_check_takes(
    make_device: Any, auth_deadline: asyncio.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deadline is for the auth frame to arrive: a check still running when it passes
    (a slow database, a busy machine) ends in ready, not auth_timeout or service_unavailable."""
    sim = await db_async(make_device)()
    checking, finish = threading.Event(), threading.Event()
    check = device_identity.authenticate_challenge

    def slow_check(*args: Any) -> Any:
        checking.set()
        assert finish.wait(SOCKET_TIMEOUT * 3)
        return check(*args)

    monkeypatch.setattr(device_identity, "authenticate_challenge", slow_check)
    comm, challenge = await open_socket(authenticate=False)
    try:
        await comm.send_json_to(auth_frame(sim, challenge))
        assert await asyncio.to_thread(checking.wait, SOCKET_TIMEOUT)
        auth_deadline.set()  # the deadline passes while the check runs
        assert await comm.receive_nothing()
    finally:
        finish.set()
    ready = await comm.receive_json_from()
    assert ready["type"] == "ready" and ready["device_id"] == str(sim.device.id), ready
    await comm.send_json_to({"type": "ping", "id": "p"})
    assert (await comm.receive_json_from())["type"] == "pong"
    await comm.disconnect()


async def test_revoked_device_is_refused_at_handshake(make_device: Any) -> None:
    sim = await db_async(make_device)()
    await db_async(revoke_device)(sim.device)
    comm, challenge = await open_socket(authenticate=False)
    await comm.send_json_to({"type": "auth", "device_id": str(sim.device.id), "signature": sim.sign(auth_message(challenge["nonce"], str(sim.device.id)))})
    assert (await comm.receive_json_from())["code"] == "device_revoked"
    assert (await comm.receive_output())["code"] == 4403


async def test_revoking_closes_an_open_socket_at_once(make_device: Any) -> None:
    sim = await db_async(make_device)()
    comm, _ = await open_socket(sim)
    assert await db_async(revoke_device)(sim.device) is True
    assert (await comm.receive_json_from())["code"] == "device_revoked"
    assert (await comm.receive_output())["code"] == 4403


async def test_revoked_device_cannot_send_even_if_the_close_message_is_lost(make_device: Any) -> None:
    sim = await db_async(make_device)()
    comm, _ = await open_socket(sim)
    from django.utils import timezone

    from accounts.models import Device

    # Revoke behind the consumer's back: no group message reaches it.
    await db_async(Device.objects.filter(id=sim.device.id).update)(revoked_at=timezone.now())
    await comm.send_json_to({"type": "text", "id": "x", "text": "still here?"})
    assert (await comm.receive_json_from())["code"] == "device_revoked"
    assert (await comm.receive_output())["code"] == 4403
    assert await db_async(TimelineEntry.objects.count)() == 0


@pytest.mark.parametrize("path", SOCKETS)
async def test_a_device_revoked_between_its_login_check_and_joining_its_groups_gets_no_ready_and_none_of_the_owners_frames(
    make_device: Any, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """The race, made to happen every time: the owner revokes the device right after its
    login check passed and before its socket joined its groups, so the revocation's close
    goes to a group nobody is in yet. The socket re-checks the device once it is in its
    groups: ``device_revoked`` and 4403 instead of ``ready``, and it is in no group after."""
    sim = await db_async(make_device)()
    other = await db_async(make_device)()  # one of the owner's devices that stays
    login_check = device_identity.authenticate_challenge

    def revoked_right_after_the_check(*args: Any) -> Device:
        device = login_check(*args)
        assert revoke_device(device) is True  # its device.revoked reaches no socket: none joined yet
        return device

    monkeypatch.setattr(device_identity, "authenticate_challenge", revoked_right_after_the_check)
    comm, challenge = await open_socket(authenticate=False, path=path)
    await comm.send_json_to(auth_frame(sim, challenge))
    answer = await comm.receive_json_from()
    assert (answer["type"], answer.get("code")) == ("error", "device_revoked"), answer
    assert (await comm.receive_output())["code"] == 4403
    monkeypatch.undo()

    # The owner's frames go on, to the owner's other device, never to the revoked one's socket
    # (which left the groups it had joined): by the time the other socket has a frame, the
    # revoked one would have had it too.
    other_comm, _ = await open_socket(other)
    await push.to_owner(sim.device.owner_id, {"type": "notice", "text": "for the owner's devices", "seq": 7})
    await push.to_device(sim.device.id, {"type": "notice", "text": "for the revoked device", "seq": 8})
    assert (await other_comm.receive_json_from())["text"] == "for the owner's devices"
    assert await comm.receive_nothing(timeout=0.5)
    await other_comm.disconnect()


# One frame of each kind the sockets take, each sent after a revocation whose close message
# was lost: a frame re-checked before its handler (ping, sync; on both sockets), a frame
# re-checked in its handler's own database trip (text, ack). Audio, the voice socket's
# binary frames, is tests/voice/test_voice_session.py's.
FRAME_FAMILIES = [
    pytest.param("/ws/device/", {"type": "ping", "id": "p"}, id="device-ping"),
    pytest.param("/ws/device/", {"type": "sync", "id": "s", "after": 0}, id="device-sync"),
    pytest.param("/ws/device/", {"type": "device.state", "id": "d", "riding": True}, id="device-state"),
    pytest.param("/ws/device/", {"type": "text", "id": "t", "text": "still here?"}, id="device-text"),
    pytest.param("/ws/device/", {"type": "ack", "seq": 1, "status": "rendered"}, id="device-ack"),
    pytest.param("/ws/voice/", {"type": "ping", "id": "p"}, id="voice-ping"),
    pytest.param("/ws/voice/", {"type": "voice.stop", "id": "v"}, id="voice-stop"),
    pytest.param("/ws/voice/", {"type": "ack", "seq": 1, "status": "played"}, id="voice-ack"),
]


@pytest.mark.parametrize("path, frame", FRAME_FAMILIES)
async def test_every_kind_of_frame_rechecks_the_device_when_the_close_message_was_lost(
    make_device: Any, path: str, frame: dict[str, Any]
) -> None:
    from django.utils import timezone

    sim = await db_async(make_device)()
    await db_async(append_entry)(owner_id=sim.device.owner_id, kind="utterance", text="an entry to ack", device_id=sim.device.id, scope="owner")
    comm, _ = await open_socket(sim, path=path)
    # Revoked behind the consumer's back: no group message reaches it.
    await db_async(Device.objects.filter(id=sim.device.id).update)(revoked_at=timezone.now())
    await comm.send_json_to(frame)
    answer = await comm.receive_json_from()
    assert (answer["type"], answer.get("code")) == ("error", "device_revoked"), answer
    assert (await comm.receive_output())["code"] == 4403
    assert await db_async(Delivery.objects.count)() == 0
    assert await db_async(TimelineEntry.objects.count)() == 1


@pytest.mark.parametrize(
    "raw, code",
    [
        ("{not json", "malformed_json"),
        ("[1, 2]", "invalid_frame"),
        ('{"no_type": 1}', "invalid_frame"),
        ('{"type": "teleport"}', "unknown_type"),
        ('{"type": "text", "id": "a"}', "invalid_frame"),
        ('{"type": "text", "text": "no id"}', "invalid_frame"),
        ('{"type": "sync", "after": "zero"}', "invalid_frame"),
        ('{"type": "ack", "seq": 999, "status": "rendered"}', "unknown_entry"),
        ('{"type": "ack", "seq": 1, "status": "read"}', "invalid_frame"),
    ],
)
async def test_bad_frames_get_an_error_and_change_nothing(make_device: Any, raw: str, code: str) -> None:
    sim = await db_async(make_device)()
    comm, _ = await open_socket(sim)
    await comm.send_to(text_data=raw)
    error = await comm.receive_json_from()
    assert error["type"] == "error" and error["code"] == code
    assert await db_async(TimelineEntry.objects.count)() == 0
    # the socket stays usable
    await comm.send_json_to({"type": "ping", "id": "p"})
    assert (await comm.receive_json_from())["type"] == "pong"
    await comm.disconnect()


DEEP = "[" * 10_000 + "]" * 10_000  # well under the 64 KiB limit; deeper than json.loads' recursion limit


@pytest.mark.parametrize("path", SOCKETS)
@pytest.mark.parametrize(
    "raw, frame_id",
    [
        pytest.param('{"type": "text", "id": "d", "text": ' + DEEP + "}", None, id="nested-10000-deep"),
        pytest.param('{"type": "text", "id": "d", "text": "x", "x": ' + '{"a": ' * 40 + "1" + "}" * 41, "d", id="nested-40-deep"),
        pytest.param(r'{"type": "text", "id": "s", "text": "\ud800"}', "s", id="lone-surrogate-in-text"),
        pytest.param(r'{"type": "text", "id": "s", "text": "a\udfffb"}', "s", id="lone-low-surrogate-in-text"),
        pytest.param('{"type": "text", "id": "s", "text": "\ud800"}', "s", id="raw-lone-surrogate-in-text"),
        pytest.param(r'{"type": "text", "id": "s", "text": "ok", "\ud800": 1}', "s", id="lone-surrogate-in-a-key"),
        pytest.param(r'{"type": "text", "id": "n", "text": "a\u0000b"}', "n", id="nul-in-text"),
        pytest.param(r'{"type": "text", "id": "n\u0000", "text": "hi"}', None, id="nul-in-id"),
        pytest.param(r'{"type": "text", "id": "l", "text": "hi", "tags": [["\u0000"]]}', "l", id="nul-in-a-nested-list"),
    ],
)
async def test_frames_that_cannot_be_stored_get_invalid_frame_and_the_socket_lives(
    make_device: Any, brain: Any, path: str, raw: str, frame_id: str | None
) -> None:
    """Refused at the parsing boundary both sockets share, before any handler: strings
    holding NUL (PostgreSQL cannot store it) or a lone surrogate (UTF-8 cannot encode it),
    and frames nested too deep (the JSON parser's own recursion limit included)."""
    sim = await db_async(make_device)()
    comm, _ = await open_socket(sim, path=path)
    await comm.send_to(text_data=raw)
    error = await comm.receive_json_from()
    assert error["type"] == "error" and error["code"] == "invalid_frame", error
    assert error.get("id") == frame_id
    assert await db_async(TimelineEntry.objects.count)() == 0
    # The socket, and its database connection, still work. An escaped surrogate pair is one
    # real character, and passes.
    if path == "/ws/device/":
        await comm.send_to(text_data=r'{"type": "text", "id": "after", "text": "still here \ud83d\ude00"}')
        ack = await receive_until(comm, "text.ack", "error")
        assert ack["type"] == "text.ack", ack
        await receive_until(comm, "reply.done")
        assert await db_async(lambda: TimelineEntry.objects.get(seq=ack["seq"]).text)() == "still here \U0001F600"
    else:
        await comm.send_json_to({"type": "ping", "id": "after"})
        assert (await comm.receive_json_from())["type"] == "pong"
    await comm.disconnect()


@pytest.mark.parametrize("path", SOCKETS)
async def test_an_unexpected_error_answers_internal_error_logs_it_and_the_socket_lives(
    make_device: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    sim = await db_async(make_device)()

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("trace text /srv/secret-path")  # a bug, anywhere under a handler

    monkeypatch.setattr(device_services, "acknowledge", broken)
    comm, _ = await open_socket(sim, path=path)
    with caplog.at_level(logging.ERROR, logger="yimi"):
        await comm.send_json_to({"type": "ack", "seq": 1, "status": "rendered"})
        error = await comm.receive_json_from()
    assert error == {"type": "error", "code": "internal_error", "message": error["message"]}
    assert "secret" not in error["message"] and "RuntimeError" not in error["message"]
    [logged] = [r for r in caplog.records if r.getMessage() == "ws_internal_error"]
    assert logged.levelno == logging.ERROR
    assert logged.yimi_fields["error"] == "RuntimeError" and logged.yimi_fields["device_id"] == str(sim.device.id)
    assert logged.yimi_fields["raised_at"].startswith("test_websocket.py:")
    await comm.send_json_to({"type": "ping", "id": "after"})
    assert (await comm.receive_json_from()) == {"type": "pong", "id": "after"}
    await comm.disconnect()


async def test_an_unexpected_error_before_ready_answers_internal_error_and_closes_with_1011(
    make_device: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = await db_async(make_device)()

    def broken(*args: Any) -> None:
        raise RuntimeError("trace text")

    monkeypatch.setattr(device_identity, "authenticate_challenge", broken)
    comm, challenge = await open_socket(authenticate=False)
    await comm.send_json_to(auth_frame(sim, challenge))
    assert (await comm.receive_json_from())["code"] == "internal_error"
    assert (await comm.receive_output())["code"] == 1011


async def test_oversized_frame_is_refused(make_device: Any, settings: Any) -> None:
    sim = await db_async(make_device)()
    comm, _ = await open_socket(sim)
    big = json.dumps({"type": "text", "id": "big", "text": "x" * settings.WS_MAX_FRAME_BYTES})
    await comm.send_to(text_data=big)
    assert (await comm.receive_json_from())["code"] == "frame_too_large"
    too_long = json.dumps({"type": "text", "id": "long", "text": "y" * (settings.WS_MAX_TEXT_CHARS + 1)})
    await comm.send_to(text_data=too_long)
    assert (await comm.receive_json_from())["code"] == "text_too_long"
    assert await db_async(TimelineEntry.objects.count)() == 0
    await comm.disconnect()


async def test_text_round_trip_with_chunks_ack_and_sync_on_another_device(make_device: Any, brain: Any) -> None:
    script(brain, match="weather", reply="Sunny and mild today. Take a light jacket.", chunk_chars=5)  # no number: no receipt backs one
    phone, mac = await db_async(make_device)("phone"), await db_async(make_device)("mac")
    phone_ws, _ = await open_socket(phone)
    mac_ws, _ = await open_socket(mac)

    await phone_ws.send_json_to({"type": "text", "id": "m1", "text": "How is the weather?"})
    ack = await receive_until(phone_ws, "text.ack")
    assert ack["id"] == "m1" and ack["seq"] == 1 and ack["run_id"] and ack["duplicate"] is False

    chunks = []
    while True:
        frame = await receive_until(phone_ws, "reply.chunk", "reply.done")
        if frame["type"] == "reply.done":
            break
        assert frame["reply_to_seq"] == 1 and frame["index"] == len(chunks)
        chunks.append(frame["text"])
    assert len(chunks) >= 2 and "".join(chunks) == "Sunny and mild today. Take a light jacket." == frame["text"]
    assert frame["seq"] == 2
    await phone_ws.send_json_to({"type": "ack", "seq": 2, "status": "rendered"})
    await phone_ws.send_json_to({"type": "ping", "id": "after-ack"})
    await receive_until(phone_ws, "pong")
    assert await db_async(lambda: list(Delivery.objects.values_list("entry__seq", "device_id", "status")))() == [
        (2, phone.device.id, "rendered")
    ]

    # The mac got no chunks, only a hint to sync; the exchange is in its sync.
    hint = await receive_until(mac_ws, "timeline.new", "reply.chunk")
    assert hint["type"] == "timeline.new"
    await mac_ws.send_json_to({"type": "sync", "id": "s", "after": 0, "limit": 1})
    page = await receive_until(mac_ws, "sync.page")
    assert [e["seq"] for e in page["entries"]] == [1] and page["has_more"] is True and page["next_after"] == 1
    assert page["entries"][0] | {"created_at": None} == {
        "seq": 1, "kind": "utterance", "text": "How is the weather?", "device_id": str(phone.device.id),
        "scope": "owner", "reply_to_seq": None, "notice_code": None, "created_at": None,
    }
    await mac_ws.send_json_to({"type": "sync", "id": "s2", "after": 1, "limit": 50})
    page = await receive_until(mac_ws, "sync.page")
    assert [(e["seq"], e["kind"], e["reply_to_seq"]) for e in page["entries"]] == [(2, "reply", 1)]
    assert page["has_more"] is False
    run = await db_async(Run.objects.get)()
    assert run.state == "succeeded" and run.scope == "owner"
    await phone_ws.disconnect()
    await mac_ws.disconnect()


async def frames_until(comm: Any, last: str) -> list[dict[str, Any]]:
    """Every frame up to and including the first of type ``last``."""
    frames = [json.loads(await comm.receive_from(timeout=SOCKET_TIMEOUT))]
    while frames[-1]["type"] != last:
        frames.append(json.loads(await comm.receive_from(timeout=SOCKET_TIMEOUT)))
    return frames


async def test_timeline_new_goes_to_the_devices_that_do_not_know_the_seq_yet(make_device: Any, brain: Any) -> None:
    """The device that spoke was told its utterance's seq (text.ack) and its reply's
    (reply.done): it gets no timeline.new for them; the other devices get the hint."""
    script(brain, reply="Noted.")
    phone, mac = await db_async(make_device)("phone"), await db_async(make_device)("mac")
    phone_ws, _ = await open_socket(phone)
    mac_ws, _ = await open_socket(mac)

    await phone_ws.send_json_to({"type": "text", "id": "p1", "text": "hello"})
    spoken = await frames_until(phone_ws, "reply.done")
    assert set(spoken[-1]) == {"type", "run_id", "reply_to_seq", "seq", "text"}  # what protocol.md lists, nothing internal
    await mac_ws.send_json_to({"type": "text", "id": "m1", "text": "hello from the mac"})
    heard = await frames_until(mac_ws, "reply.done")
    # The mac's exchange came after the phone's whole reply: every hint for seq 1 and 2 was
    # sent before the mac's text.ack, and the mac got at least the one for seq 2.
    assert {"type": "timeline.new", "seq": 2} in heard
    assert [f for f in heard if f["type"] == "timeline.new" and f["seq"] > 2] == []
    seen = spoken + await frames_until(phone_ws, "timeline.new")  # the mac's entries: the phone is told
    await phone_ws.send_json_to({"type": "ping", "id": "after"})
    seen += await frames_until(phone_ws, "pong")
    hints = [f["seq"] for f in seen if f["type"] == "timeline.new"]
    assert hints and min(hints) >= 3  # none for the phone's own seq 1 and 2
    await phone_ws.disconnect()
    await mac_ws.disconnect()


async def test_the_ack_of_a_reply_that_told_no_facts_closes_no_ledger(make_device: Any, brain: Any, monkeypatch: Any) -> None:
    """The runner's reply.done says whether the reply carried facts; the socket passes that
    to the ACK (``acknowledge``'s ``ledgers``). A reply.done that does not say (any other
    sender) closes the ledgers as before."""
    script(brain, reply="Noted.")
    seen: list[bool] = []
    real = device_services.acknowledge

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("ledgers", True))
        return real(*args, **kwargs)

    monkeypatch.setattr(device_services, "acknowledge", recording)
    phone = await db_async(make_device)("phone")
    phone_ws, _ = await open_socket(phone)
    await phone_ws.send_json_to({"type": "text", "id": "p1", "text": "hello"})
    done = await receive_until(phone_ws, "reply.done")
    await phone_ws.send_json_to({"type": "ack", "seq": done["seq"], "status": "rendered"})
    await phone_ws.send_json_to({"type": "ping", "id": "a"})
    await receive_until(phone_ws, "pong")
    other = await db_async(lambda: append_entry(owner_id=phone.device.owner_id, kind="reply", text="a report", scope="owner"))()
    await push.to_device(phone.device.id, {"type": "reply.done", "run_id": done["run_id"], "reply_to_seq": 1, "seq": other.seq, "text": "a report"})
    await receive_until(phone_ws, "reply.done")
    await phone_ws.send_json_to({"type": "ack", "seq": other.seq, "status": "rendered"})
    await phone_ws.send_json_to({"type": "ping", "id": "b"})
    await receive_until(phone_ws, "pong")
    assert seen == [False, True]
    await phone_ws.disconnect()


async def test_resending_the_same_frame_id_stores_nothing_new(make_device: Any, brain: Any) -> None:
    sim = await db_async(make_device)()
    comm, _ = await open_socket(sim)
    await comm.send_json_to({"type": "text", "id": "same", "text": "once"})
    first = await receive_until(comm, "text.ack")
    await receive_until(comm, "reply.done")
    await comm.send_json_to({"type": "text", "id": "same", "text": "once"})
    second = await receive_until(comm, "text.ack")
    assert second["seq"] == first["seq"] and second["run_id"] == first["run_id"] and second["duplicate"] is True
    assert await db_async(Run.objects.count)() == 1
    assert await db_async(TimelineEntry.objects.filter(kind="utterance").count)() == 1
    await comm.disconnect()


async def test_inbound_entry_records_scope_owner_and_guest(make_device: Any, brain: Any) -> None:
    owner_dev, guest_dev = await db_async(make_device)(), await db_async(make_device)(guest=True)
    for sim, expected in ((owner_dev, "owner"), (guest_dev, "guest")):
        comm, ready = await open_socket(sim)
        assert ready["scope"] == expected
        await comm.send_json_to({"type": "text", "id": new_client_id(), "text": "hello"})
        ack = await receive_until(comm, "text.ack")
        await receive_until(comm, "reply.done")
        entry = await db_async(TimelineEntry.objects.get)(seq=ack["seq"])
        admission = await db_async(AdmissionRecord.objects.get)(run__inbound=entry)
        assert entry.scope == expected == admission.scope
        await comm.disconnect()


async def test_ready_reports_the_scope_admission_will_use_for_a_device_of_another_account(
    owner: Any, brain: Any, django_user_model: Any
) -> None:
    """A non-guest device of a second superuser is admitted as guest everywhere; ready says so."""

    def device_of_another_account() -> SimDevice:
        other = django_user_model.objects.create_superuser("second-admin", password="pw-pw-pw-pw")
        key, public = new_keypair()
        device = Device.objects.create(owner=other, name="their phone", kind="phone", capture_channels=["phone_app"], public_key=public)
        return SimDevice(device=device, key=key)

    sim = await db_async(device_of_another_account)()
    comm, ready = await open_socket(sim)
    assert ready["scope"] == "guest"
    await comm.send_json_to({"type": "text", "id": new_client_id(), "text": "hello"})
    ack = await receive_until(comm, "text.ack")
    await receive_until(comm, "reply.done")
    admission = await db_async(AdmissionRecord.objects.get)(run__inbound__seq=ack["seq"], owner_id=sim.device.owner_id)
    assert admission.scope == ready["scope"]
    await comm.disconnect()


async def test_guest_device_syncs_only_its_own_exchange(make_device: Any, brain: Any) -> None:
    owner_dev, guest_dev = await db_async(make_device)(), await db_async(make_device)(guest=True)
    owner_ws, _ = await open_socket(owner_dev)
    await owner_ws.send_json_to({"type": "text", "id": "private", "text": "my bank PIN hint is..."})
    await receive_until(owner_ws, "reply.done")
    guest_ws, _ = await open_socket(guest_dev)
    await guest_ws.send_json_to({"type": "text", "id": "g", "text": "what time is it?"})
    await receive_until(guest_ws, "reply.done")
    await guest_ws.send_json_to({"type": "sync", "after": 0})
    page = await receive_until(guest_ws, "sync.page")
    assert [e["text"] for e in page["entries"]][0] == "what time is it?"
    assert all("PIN" not in e["text"] for e in page["entries"]) and len(page["entries"]) == 2
    # and the guest's run was not shown the owner's history
    assert all("PIN" not in m["content"] for m in brain.script.requests[-1]["messages"])
    await owner_ws.disconnect()
    await guest_ws.disconnect()


async def test_binary_frames_are_refused_on_the_text_socket(make_device: Any) -> None:
    sim = await db_async(make_device)()
    comm, _ = await open_socket(sim)
    await comm.send_to(bytes_data=b"\x00\x01")
    assert (await comm.receive_json_from())["code"] == "binary_not_supported"
    await comm.disconnect()
    await asyncio.sleep(0)


async def test_a_guest_cannot_ack_an_entry_it_cannot_see(make_device: Any, brain: Any) -> None:
    from capabilities.models import ToldFact

    owner_dev, guest_dev = await db_async(make_device)(), await db_async(make_device)(guest=True)
    owner_ws, _ = await open_socket(owner_dev)
    await owner_ws.send_json_to({"type": "text", "id": "private", "text": "remind me about the clinic"})
    owner_reply = await receive_until(owner_ws, "reply.done")
    entry = await db_async(TimelineEntry.objects.get)(seq=owner_reply["seq"])
    told = await db_async(ToldFact.objects.create)(owner_id=entry.owner_id, entry=entry, fact_id="clinic")
    guest_ws, _ = await open_socket(guest_dev)
    for seq in (owner_reply["seq"] - 1, owner_reply["seq"]):  # the owner's utterance and Yimi's reply to it
        await guest_ws.send_json_to({"type": "ack", "seq": seq, "status": "rendered"})
        error = await receive_until(guest_ws, "error")
        assert error["code"] == "unknown_entry"
    assert await db_async(Delivery.objects.filter(device_id=guest_dev.device.id).exists)() is False
    await db_async(told.refresh_from_db)()
    assert told.acknowledged_at is None  # the owner's fact is not marked as told
    # The guest's own exchange it may ACK.
    await guest_ws.send_json_to({"type": "text", "id": "g", "text": "what time is it?"})
    guest_reply = await receive_until(guest_ws, "reply.done")
    await guest_ws.send_json_to({"type": "ack", "seq": guest_reply["seq"], "status": "rendered"})
    await guest_ws.send_json_to({"type": "ping", "id": "after-ack"})
    assert (await receive_until(guest_ws, "pong", "error"))["type"] == "pong"
    assert await db_async(lambda: list(Delivery.objects.filter(device_id=guest_dev.device.id).values_list("entry__seq", flat=True)))() == [
        guest_reply["seq"]
    ]
    await owner_ws.disconnect()
    await guest_ws.disconnect()


async def test_ready_tells_a_guest_only_the_last_seq_it_may_see(make_device: Any, brain: Any) -> None:
    owner_dev, guest_dev = await db_async(make_device)(), await db_async(make_device)(guest=True)
    guest_ws, ready = await open_socket(guest_dev)
    assert ready["last_seq"] == 0
    await guest_ws.send_json_to({"type": "text", "id": "g", "text": "hello"})
    guest_reply = await receive_until(guest_ws, "reply.done")
    await guest_ws.disconnect()
    owner_ws, _ = await open_socket(owner_dev)
    for n in range(2):
        await owner_ws.send_json_to({"type": "text", "id": f"o{n}", "text": "something private"})
        await receive_until(owner_ws, "reply.done")
    await owner_ws.disconnect()

    guest_ws, ready = await open_socket(guest_dev)
    assert ready["last_seq"] == guest_reply["seq"] == 2  # not the owner's 6
    await guest_ws.disconnect()
    owner_ws, ready = await open_socket(owner_dev)
    assert ready["last_seq"] == 6
    await owner_ws.disconnect()


def closed_port() -> int:
    """A loopback port nobody listens on: connecting to it is refused, as when Redis is down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("path", ["/ws/device/", "/ws/voice/"])
async def test_redis_down_is_service_unavailable_and_closes_with_1013(settings: Any, path: str) -> None:
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [{"address": f"redis://127.0.0.1:{closed_port()}/0",
                                  "socket_timeout": settings.CHANNEL_LAYER_SOCKET_TIMEOUT_SECONDS}]},
        }
    }
    from yimi_project.asgi import application

    comm = WebsocketCommunicator(application, path)
    connected, _ = await comm.connect(timeout=10)
    assert connected
    frames = []
    while (output := await comm.receive_output(timeout=10))["type"] != "websocket.close":
        frames.append(json.loads(output["text"]))
    assert output["code"] == 1013
    *before, error = frames
    assert [f["type"] for f in before] in ([], ["challenge"])  # the channel layer fails at once, or right after the challenge
    assert error == {"type": "error", "code": "service_unavailable", "message": error["message"],
                     "retry_after": settings.WS_RETRY_AFTER_SECONDS}
