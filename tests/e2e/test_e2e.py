"""End to end: a real daphne process and a real Celery worker against PostgreSQL and
Redis; two simulated devices speaking the real protocol over real websockets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from django.conf import settings as django_settings
from django.db import connection

from accounts.devices import issue_pairing_code
from devices.models import Delivery
from devices.simulator import DeviceConnection, pair, read_timeline
from memory.models import TimelineEntry
from tests.conftest import db_async, need, script
from tests.support.ports import free_port
from tests.support.process_support import (
    ROOT,
    CeleryWorker,
    redis_prefix,
    stop_processes,
    subprocess_test_database_url,
    wait_for_sessions_to_end,
    worker_env,
)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def platform(owner: Any, brain: Any) -> Iterator[dict[str, Any]]:
    """daphne + a Celery worker, as ``./yimi up`` starts them, on the test database."""
    need(connection.vendor == "postgresql", "the end-to-end test runs on PostgreSQL (set DATABASE_URL)")
    need(bool(django_settings.REDIS_URL), "the end-to-end test needs Redis (set REDIS_URL)")
    with redis_prefix("e2e") as prefix:
        port = free_port()
        # Redis keys of their own under prefix (channel layer, task queue, kombu's bindings),
        # deleted after; the database sessions tagged prefix.
        env = worker_env(
            prefix,
            YIMI_BRAIN_BASE_URL=brain.base_url,
            # Sub-agents reach the gateway over HTTP on the internal listener (daphne -u), as in production.
            YIMI_GATEWAY_OVER_HTTP="1",
            YIMI_INTERNAL_SOCKET=str(Path(django_settings.DATA_DIR) / "sockets" / f"e2e-{port}.sock"),
            YIMI_WORKSPACE_DIR=str(Path(django_settings.DATA_DIR) / "e2e-workspace"),
        )
        bindir = Path(sys.executable).parent
        Path(env["YIMI_INTERNAL_SOCKET"]).parent.mkdir(parents=True, exist_ok=True)
        logs = Path(django_settings.DATA_DIR)
        procs = [
            subprocess.Popen(
                [str(bindir / "daphne"), "-b", "127.0.0.1", "-p", str(port), "-u", env["YIMI_INTERNAL_SOCKET"], "yimi_project.asgi:application"],
                cwd=ROOT, env=env, stdout=open(logs / "daphne.log", "w"), stderr=subprocess.STDOUT,
            ),
            CeleryWorker(env, logs / "celery.log").proc,
        ]
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(base + "/api/health/", timeout=1).json()["channel_layer"] == "redis":
                        break
                except (httpx.HTTPError, ValueError):
                    pass
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    pytest.fail("daphne did not start:\n" + (logs / "daphne.log").read_text()[-3000:])
                time.sleep(0.2)
            yield {"base": base, "owner": owner, "logs": logs, "workspace": Path(env["YIMI_WORKSPACE_DIR"])}
        finally:
            stop_processes(procs)
            wait_for_sessions_to_end(prefix)


async def test_text_from_one_device_is_answered_there_and_synced_to_another(platform: dict[str, Any], brain: Any) -> None:
    from tests.conftest import db_async

    script(brain, match="plan", reply="Your plan for today: the gym in the morning. Lunch with Lin at noon.", chunk_chars=6)
    owner = platform["owner"]
    (_, phone_code), (_, mac_code) = [await db_async(issue_pairing_code)(owner) for _ in range(2)]
    phone = await pair(platform["base"], phone_code, kind="phone", name="e2e phone")
    mac = await pair(platform["base"], mac_code, kind="mac", name="e2e mac", capture_channels=["mac"])

    async with DeviceConnection(phone) as phone_ws, DeviceConnection(mac) as mac_ws:
        ack = await phone_ws.say("What is my plan today?")
        assert ack["seq"] == 1 and ack["duplicate"] is False
        try:
            chunks, done = await phone_ws.reply_to(ack["seq"], timeout=60)
        except Exception:
            print((platform["logs"] / "celery.log").read_text()[-3000:])
            raise
        assert done["type"] == "reply.done", done
        assert len(chunks) > 1 and "".join(chunks) == done["text"] == "Your plan for today: the gym in the morning. Lunch with Lin at noon."
        await phone_ws.ack(done["seq"], "rendered")

        entries = await mac_ws.sync(after=0, limit=1)  # one entry per page: paging is exercised
        assert [(e["seq"], e["kind"]) for e in entries] == [(1, "utterance"), (2, "reply")]
        assert entries[0]["device_id"] == phone.device_id and entries[1]["text"] == done["text"]
        assert entries[0]["scope"] == "owner"
        # The same entries over the signed HTTP API (Host and a fresh nonce signed).
        page = await read_timeline(mac, after=0)
        assert [e["seq"] for e in page["entries"]] == [1, 2]

    deadline = time.monotonic() + 5
    while not await db_async(Delivery.objects.filter(entry__seq=done["seq"], status="rendered").exists)():
        assert time.monotonic() < deadline, "the ACK was not recorded"
        await asyncio.sleep(0.1)


async def test_delegated_workspace_write_is_receipted_checked_reported_and_acked(platform: dict[str, Any], brain: Any) -> None:
    """text → run → delegate → workspace tool over MCP (in the Celery worker) → receipt via
    the loopback gateway → checked follow-up on the device that spoke → ACK."""
    from capabilities.models import ReceiptRecord, ToldFact
    from tests.conftest import db_async

    # The report turn's prompt quotes the task's goal (纪要 too), so its rule comes first.
    script(brain, match="Background task finished", reply="纪要写好了，一共12个字节，另外还有7个附件。")
    script(brain, match="纪要", requires_tool="steer", reply="好，我去整理。",
           tool_calls=[{"name": "delegate", "arguments": {"goal": "把纪要写进 notes/e2e.md"}}])
    # The shipped packs have more than 20 tools: the sub-agent finds the one it needs first.
    script(brain, requires_tool="find_tools", forbids_tool="workspace__write_file", reply="",
           tool_calls=[{"name": "find_tools", "arguments": {"query": "workspace__write_file"}}])
    write = [{"name": "workspace__write_file", "arguments": {"path": "notes/e2e.md", "content": "十点开会", "owner_requested": True}}]
    script(brain, when="tool", match='"next_offset"', requires_tool="workspace__write_file", reply="", tool_calls=write)
    script(brain, when="tool", requires_tool="workspace__write_file", reply="写好了。")

    (_, code), = [await db_async(issue_pairing_code)(platform["owner"])]
    phone = await pair(platform["base"], code, kind="phone", name="e2e phone")
    async with DeviceConnection(phone) as ws:
        ack = await ws.say("把今天的纪要整理一下")
        _, first = await ws.reply_to(ack["seq"], timeout=60)
        assert first["type"] == "reply.done" and first["text"] == "好，我去整理。"
        await ws.ack(first["seq"])
        try:
            _, report = await ws.reply_to(ack["seq"], timeout=90)
        except Exception:
            print((platform["logs"] / "celery.log").read_text()[-4000:])
            raise
        assert report["type"] == "reply.done" and report["seq"] > first["seq"]
        assert "12" in report["text"] and "7个附件" not in report["text"]  # the checker removed the unsupported claim
        await ws.ack(report["seq"])
        await ws.send({"type": "ping", "id": "flush"})
        await ws.next_frame("pong")

    assert (platform["workspace"] / "notes" / "e2e.md").read_text() == "十点开会"
    record = await db_async(ReceiptRecord.objects.get)(call__tool="workspace__write_file")
    assert record.status == "succeeded" and record.receipt["effects"][0]["verification"] == "verified"
    told = await db_async(lambda: list(ToldFact.objects.filter(entry__seq=report["seq"]).values_list("acknowledged_at", flat=True)))()
    assert told and all(t is not None for t in told)


class VoiceConnection(DeviceConnection):
    """The same signed handshake, on the voice socket."""

    @property
    def ws_url(self) -> str:
        return super().ws_url.replace("/ws/device/", "/ws/voice/")


# Three of the channel layer's 5 s blocking pops, past redis-py's default 5 s read timeout
# and the layer's own socket timeout.
IDLE_SECONDS = 15.0


async def test_idle_device_and_voice_sockets_stay_open_on_redis_and_still_get_replies(platform: dict[str, Any], brain: Any) -> None:
    script(brain, match="still there", reply="Still here, listening.", chunk_chars=6)
    (_, code), = [await db_async(issue_pairing_code)(platform["owner"])]
    phone = await pair(platform["base"], code, kind="phone", name="e2e phone")
    async with DeviceConnection(phone) as device_ws, VoiceConnection(phone) as voice_ws:
        await asyncio.sleep(IDLE_SECONDS)  # the point of the test: both sockets idle, at once
        for ws in (device_ws, voice_ws):
            assert ws.closed is not None
            assert not ws.closed.done(), f"{ws.ws_url} was closed while idle: {ws.closed.result()}"
        ack = await device_ws.say("Are you still there?")
        _, done = await device_ws.reply_to(ack["seq"], timeout=60)
        assert done["type"] == "reply.done" and done["text"] == "Still here, listening."
        # The voice socket is in the same device group: the reply reached it through Redis too.
        heard = await voice_ws.next_frame("reply.done", timeout=30)
        assert heard["seq"] == done["seq"]
        await voice_ws.send({"type": "ping", "id": "voice"})
        assert (await voice_ws.next_frame("pong"))["id"] == "voice"


@contextlib.contextmanager
def bare_daphne(log_name: str, *, kill: bool = False, **env_overrides: str) -> Iterator[str]:
    """daphne alone (no Celery), with the in-memory channel layer unless told otherwise;
    yields its base URL once it accepts connections. ``kill``: stop it with SIGKILL (a
    thread blocked on an unreachable database would hold up a clean exit)."""
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "yimi_project.settings",
        "REDIS_URL": "",
        "YIMI_EMBEDDED_SWEEPER": "0",
        "YIMI_DATA_DIR": str(django_settings.DATA_DIR),
        "PYTHONUNBUFFERED": "1",
        **env_overrides,
    }
    log = Path(env["YIMI_DATA_DIR"]) / log_name
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "daphne"), "-b", "127.0.0.1", "-p", str(port), "yimi_project.asgi:application"],
        cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail("daphne did not start:\n" + log.read_text()[-3000:])
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill() if kill else proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_a_message_over_the_transport_limit_closes_with_1009(owner: Any) -> None:
    with bare_daphne("daphne-limits.log", DATABASE_URL=subprocess_test_database_url()) as base:
        (_, code), = [await db_async(issue_pairing_code)(owner)]
        phone = await pair(base, code, kind="phone", name="big frames")
        async with DeviceConnection(phone) as ws:
            # Over the protocol's 64 KiB but under the transport's 1 MiB: refused, the socket stays open.
            await ws.send({"type": "text", "id": "big", "text": "x" * (django_settings.WS_MAX_FRAME_BYTES + 1)})
            assert (await ws.next_frame("error"))["code"] == "frame_too_large"
            await ws.send({"type": "ping", "id": "still-open"})
            assert (await ws.next_frame("pong"))["id"] == "still-open"
            # 10 MB: refused by the transport before the application sees it, with the standard close.
            with contextlib.suppress(websockets.ConnectionClosed):
                await ws.ws.send(json.dumps({"type": "text", "id": "huge", "text": "y" * 10_000_000}))
            assert ws.closed is not None
            code_, reason = await asyncio.wait_for(ws.closed, 30)
            assert code_ == 1009, (code_, reason)
            assert "exceeds payload limit of 1048576" in reason


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b'{"type": "text", "id": "bad", "text": "\xff"}', id="invalid-byte"),
        pytest.param(b'{"type": "text", "id": "bad", "text": "\xed\xa0\x80"}', id="encoded-surrogate"),
        pytest.param(b'{"type": "text", "id": "bad", "text": "\xe2\x82"}', id="truncated-character"),
    ],
)
async def test_invalid_utf8_in_a_text_message_closes_with_1007(owner: Any, payload: bytes) -> None:
    """RFC 6455 section 8.1: a text message that is not UTF-8 fails the connection with 1007,
    checked by the transport, on both sockets; the application never sees it."""
    with bare_daphne("daphne-utf8.log", DATABASE_URL=subprocess_test_database_url()) as base:
        (_, code), = [await db_async(issue_pairing_code)(owner)]
        phone = await pair(base, code, kind="phone", name="bad bytes")
        for connection in (DeviceConnection(phone), VoiceConnection(phone)):
            async with connection as ws:
                # The raw bytes, sent as a text frame exactly as they are (no encoding, no check).
                with contextlib.suppress(websockets.ConnectionClosed):
                    await ws.ws.send(payload, text=True)
                assert ws.closed is not None
                code_, reason = await asyncio.wait_for(ws.closed, 30)
                assert code_ == 1007, (ws.ws_url, code_, reason)
                assert "UTF-8" in reason
    assert await db_async(TimelineEntry.objects.count)() == 0


class SilentDatabase:
    """A TCP listener that never answers: a PostgreSQL server that hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]

    def close(self) -> None:
        self.sock.close()  # the kernel resets the connections nobody accepted: the client unblocks


@pytest.mark.parametrize("database", ["refuses", "hangs"])
async def test_database_down_is_service_unavailable_and_closes_with_1013(tmp_path: Path, database: str) -> None:
    silent = SilentDatabase()
    port = silent.port
    if database == "refuses":
        silent.close()
    url = f"postgres://postgres@127.0.0.1:{port}/yimi"
    # The check outlasts the auth deadline (the pool gives up waiting for a connection after
    # 3 s, the deadline is 1 s): the deadline stopped when the auth frame came, so the answer
    # is service_unavailable, never auth_timeout.
    with bare_daphne("daphne-db-down.log", kill=True, DATABASE_URL=url, YIMI_DATA_DIR=str(tmp_path),
                     YIMI_WS_AUTH_TIMEOUT_SECONDS="1", YIMI_DB_POOL_TIMEOUT_SECONDS="3") as base:
        try:
            async with websockets.connect(base.replace("http://", "ws://") + "/ws/device/", open_timeout=10) as ws:
                challenge = json.loads(await asyncio.wait_for(ws.recv(), 10))
                assert challenge["type"] == "challenge"
                await ws.send(json.dumps({"type": "auth", "device_id": str(uuid.uuid4()), "signature": "AAAA"}))
                error = json.loads(await asyncio.wait_for(ws.recv(), 30))
                assert error["type"] == "error" and error["code"] == "service_unavailable", error
                assert error["retry_after"] == django_settings.WS_RETRY_AFTER_SECONDS
                with pytest.raises(websockets.ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 30)
                assert ws.close_code == 1013
        finally:
            silent.close()  # before daphne stops, so its database thread is not left hanging
