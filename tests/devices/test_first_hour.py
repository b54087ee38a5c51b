"""The first hour on a fresh clone: every CLI error of device_sim, pairing_code, yimi_init
and fake_brain is one line saying what to do (a ``CommandError``, never a traceback)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from accounts.models import PairingCode
from accounts.signatures import challenge_message
from devices.consumers.connection import CLOSE_REVOKED
from devices.management.commands.device_sim import Command as DeviceSim
from devices.management.commands.device_sim import checked_server
from devices.simulator import DeviceIdentity, _raw_private, new_key, refusal
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]




def test_device_sim_server_defaults_to_yimi_host_and_port_and_is_explained() -> None:
    with override_settings(YIMI_HOST="127.0.0.1", YIMI_PORT=8123):
        parser = DeviceSim().create_parser("manage.py", "device_sim")
    sub = next(a for a in parser._actions if a.dest == "action")
    pair = sub.choices["pair"]  # type: ignore[attr-defined]
    assert pair.get_default("server") == "http://127.0.0.1:8123"
    assert "YIMI_PORT" in pair.format_help()


def test_pair_with_a_server_that_is_not_running_names_its_address(tmp_path: Path) -> None:
    port = free_port()
    with override_settings(YIMI_PORT=port), pytest.raises(CommandError) as error:
        call_command("device_sim", "pair", "ABCD-EFGH", "--key-file", str(tmp_path / "phone.json"))
    assert f"http://127.0.0.1:{port}" in str(error.value)
    assert "./yimi up" in str(error.value)
    assert "\n" not in str(error.value)


def test_pair_with_a_server_without_scheme_says_to_add_it(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="needs its scheme"):
        call_command("device_sim", "pair", "ABCD", "--server", "127.0.0.1:8000", "--key-file", str(tmp_path / "k.json"))
    with pytest.raises(CommandError, match=r"e\.g\. --server http://127\.0\.0\.1:8000$"):
        call_command("device_sim", "pair", "ABCD", "--server", "ftp://127.0.0.1:8000", "--key-file", str(tmp_path / "k.json"))


def test_a_websocket_url_names_the_same_server() -> None:
    assert checked_server("ws://127.0.0.1:8100/") == "http://127.0.0.1:8100"
    assert checked_server("wss://yimi.example") == "https://yimi.example"
    assert checked_server("http://127.0.0.1:8100/") == "http://127.0.0.1:8100"


@pytest.mark.parametrize("action", [["say", "hello"], ["sync"], ["chat"]])
def test_say_before_pairing_says_to_pair_first(tmp_path: Path, action: list[str]) -> None:
    with pytest.raises(CommandError, match="pair first"):
        call_command("device_sim", *action, "--key-file", str(tmp_path / "phone.json"))


def test_say_to_a_server_that_stopped_names_its_address(tmp_path: Path) -> None:
    port = free_port()
    _, public = new_key()
    identity = DeviceIdentity(f"http://127.0.0.1:{port}", "d1", base64.b64encode(b"\0" * 32).decode(), public, "phone", "p")
    identity.save(tmp_path / "phone.json")
    with pytest.raises(CommandError, match=f"cannot reach Yimi at http://127.0.0.1:{port}"):
        call_command("device_sim", "say", "hi", "--key-file", str(tmp_path / "phone.json"))


class RevokingServer:
    """A websocket peer speaking the device protocol's handshake, which then answers the
    first text frame the way DeviceConsumer answers a revoked device: an error, close 4403."""

    def __init__(self, *, at_once: bool = False) -> None:
        self.at_once = at_once  # revoke right after ready, before the device says anything
        self.key = Ed25519PrivateKey.generate()
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def handler(self, ws: Any) -> None:
        nonce = "n" * 24
        signature = base64.b64encode(self.key.sign(challenge_message(nonce))).decode()
        await ws.send(json.dumps({"type": "challenge", "nonce": nonce, "server_signature": signature}))
        await ws.recv()
        await ws.send(json.dumps({"type": "ready"}))
        if not self.at_once:
            await ws.recv()
        await ws.send(json.dumps({"type": "error", "code": "device_revoked", "message": "revoked"}))
        await ws.close(code=CLOSE_REVOKED)

    def __enter__(self) -> RevokingServer:
        self.thread.start()
        async def start() -> Any:
            return await websockets.serve(self.handler, "127.0.0.1", 0)

        server = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        self.server = server
        self.port = next(iter(server.sockets)).getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.close()
        asyncio.run_coroutine_threadsafe(self.server.wait_closed(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_chat_survives_a_revoke_with_a_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with RevokingServer() as server:
        key, _ = new_key()
        public = base64.b64encode(
            server.key.public_key().public_bytes_raw()  # type: ignore[attr-defined]
        ).decode()
        identity = DeviceIdentity(f"http://127.0.0.1:{server.port}", "d1", _raw_private(key), public, "phone", "p")
        identity.save(tmp_path / "phone.json")
        monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
        with pytest.raises(CommandError, match="revoked by its owner"):
            call_command("device_sim", "chat", "--key-file", str(tmp_path / "phone.json"), stdout=io.StringIO())


def test_chat_ends_at_once_when_revoked_while_waiting_for_a_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner revokes the device while nothing is typed: chat says so and ends without
    waiting for the next line (stdin here never gives one, nor its end)."""
    read_end, write_end = os.pipe()
    with RevokingServer(at_once=True) as server, open(read_end) as silent_stdin:
        key, _ = new_key()
        public = base64.b64encode(
            server.key.public_key().public_bytes_raw()  # type: ignore[attr-defined]
        ).decode()
        identity = DeviceIdentity(f"http://127.0.0.1:{server.port}", "d1", _raw_private(key), public, "phone", "p")
        identity.save(tmp_path / "phone.json")
        monkeypatch.setattr(sys, "stdin", silent_stdin)
        try:
            with pytest.raises(CommandError, match="revoked by its owner"):
                call_command("device_sim", "chat", "--key-file", str(tmp_path / "phone.json"), stdout=io.StringIO())
        finally:
            os.close(write_end)  # the stdin thread's readline ends


def test_photo_that_is_not_there_says_so_in_one_line(tmp_path: Path) -> None:
    _, public = new_key()
    identity = DeviceIdentity("http://127.0.0.1:9", "d1", base64.b64encode(b"\0" * 32).decode(), public, "phone", "p")
    identity.save(tmp_path / "phone.json")
    with pytest.raises(CommandError) as error:
        call_command("device_sim", "photo", str(tmp_path / "cup.jpg"), "--key-file", str(tmp_path / "phone.json"))
    assert str(error.value) == f"cannot read the photo {tmp_path / 'cup.jpg'}: No such file or directory (give a JPEG or PNG file)"


def test_a_refused_pairing_shows_the_servers_message_not_its_json() -> None:
    body = {"error": {"code": "invalid_code", "message": "this pairing code is not valid"}}
    response = httpx.Response(400, json=body)
    assert refusal("pairing", response) == "pairing refused: this pairing code is not valid (invalid_code, HTTP 400)"
    assert refusal("image", httpx.Response(502, text="<html>\n bad gateway </html>")) == "image refused: HTTP 502 <html> bad gateway </html>"


def test_pairing_code_before_yimi_init_says_to_set_up_first(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(YIMI_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="yimi_project.settings")
    done = subprocess.run(
        [sys.executable, "manage.py", "pairing_code"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "CommandError: this instance is not set up yet: run ./yimi up (or manage.py yimi_init) first"
    ]


@pytest.mark.django_db
def test_yimi_init_checks_the_port_before_issuing_a_pairing_code(owner: Any, taken_port: int) -> None:
    before = PairingCode.objects.count()
    with override_settings(YIMI_HOST="127.0.0.1", YIMI_PORT=taken_port), pytest.raises(CommandError) as error:
        call_command("yimi_init", "--check-ports", stdout=io.StringIO())
    assert f"port {taken_port} on 127.0.0.1" in str(error.value)
    assert "YIMI_PORT" in str(error.value)
    assert PairingCode.objects.count() == before


@pytest.mark.django_db
def test_yimi_init_refuses_a_data_directory_another_yimi_serves(owner: Any, tmp_path: Path) -> None:
    """A second `./yimi up` on another port but the same data directory must not remove the
    first one's internal socket nor issue a pairing code; a stale socket file is no obstacle."""
    path = tmp_path / "internal.sock"
    before = PairingCode.objects.count()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen()
        with (
            override_settings(YIMI_PORT=free_port(), YIMI_INTERNAL_SOCKET=path),
            pytest.raises(CommandError, match="another Yimi is running on this data directory") as error,
        ):
            call_command("yimi_init", "--check-ports", stdout=io.StringIO())
    assert "YIMI_DATA_DIR" in str(error.value) and "\n" not in str(error.value)
    assert PairingCode.objects.count() == before
    assert path.is_socket()  # closed, not removed: left behind
    with override_settings(YIMI_PORT=free_port(), YIMI_INTERNAL_SOCKET=path):
        call_command("yimi_init", "--check-ports", stdout=io.StringIO())
    assert PairingCode.objects.count() == before + 1


def test_fake_brain_on_a_port_in_use_says_so(taken_port: int) -> None:
    with pytest.raises(CommandError, match="YIMI_FAKE_BRAIN_PORT") as error:
        call_command("fake_brain", "--port", str(taken_port), stdout=io.StringIO())
    assert f"127.0.0.1:{taken_port}" in str(error.value)


def test_settings_know_where_yimi_up_serves() -> None:
    assert isinstance(settings.YIMI_PORT, int)
    assert settings.YIMI_HOST


# --- what device_sim prints: cards as a person reads them, every timeline entry -------------


def test_a_consent_card_prints_as_a_person_reads_it_not_as_json() -> None:
    from devices.simulator import card_lines

    preview = json.dumps({"action": "send", "body": "send Alice a note", "subject": "A note", "to": "alice@example.com"},
                         separators=(",", ":"), sort_keys=True)
    card = {"type": "consent.card", "card_id": "4dac2019-9a86", "category": "send", "tool": "messaging__send",
            "target": "alice@example.com", "preview": preview, "owner_requested": True}
    lines = card_lines(card, answer_with="--key-file var/phone.json")
    assert lines == [
        "[card 4dac2019-9a86] Send this? (messaging send; you asked for this)",
        "  to: alice@example.com",
        "  action: send",
        "  body: send Alice a note",
        "  subject: A note",
        "  approve: manage.py device_sim approve 4dac2019-9a86 --key-file var/phone.json",
        "  deny:    manage.py device_sim deny 4dac2019-9a86 --key-file var/phone.json",
    ]
    assert not any("{" in line or '":' in line for line in lines)
    # a preview cut at its 500 characters is no longer JSON: shown as it is, not dropped
    cut = card_lines({**card, "preview": preview[:30], "owner_requested": False}, answer_with="--key-file k")
    assert cut[0].endswith("(messaging send; Yimi wants to do this on her own)")
    assert cut[2] == f"  what: {preview[:30].strip()}"


def test_a_payment_card_prints_its_amount_payee_and_items() -> None:
    from devices.simulator import card_lines

    card = {"type": "payment.card", "authorization_id": "d4af3362", "payee": "milk-tea-shop", "merchant": "奶茶小铺",
            "amount": "18.00", "currency": "CNY", "items": [{"item": "珍珠奶茶", "quantity": 1}], "eta": "", "replacement": 0}
    assert card_lines(card, answer_with="--key-file var/phone.json") == [
        "[card d4af3362] Pay 18.00 CNY to 奶茶小铺?",
        "  for: 珍珠奶茶 ×1",
        "  approve: manage.py device_sim approve d4af3362 --key-file var/phone.json",
        "  deny:    manage.py device_sim deny d4af3362 --key-file var/phone.json",
    ]


def test_sync_prints_every_kind_of_timeline_entry_an_image_included() -> None:
    from devices.simulator import timeline_line

    entries = [
        {"seq": 18, "kind": "image", "text": "[image 512×600 jpeg]", "notice_code": None},
        {"seq": 19, "kind": "utterance", "text": "看看这是什么", "notice_code": None},
        {"seq": 20, "kind": "reply", "text": "好，不发了。", "notice_code": None},
        {"seq": 21, "kind": "notice", "text": "该喝水了", "notice_code": "reminder"},
        {"seq": 22, "kind": "something_new", "text": "x", "notice_code": None},
    ]
    assert [timeline_line(e) for e in entries] == [
        "[#18] photo: [image 512×600 jpeg]",
        "[#19] you: 看看这是什么",
        "[#20] yimi: 好，不发了。",
        "[#21] notice (reminder): 该喝水了",
        "[#22] something_new: x",  # a kind this simulator does not know is printed, not a KeyError
    ]
