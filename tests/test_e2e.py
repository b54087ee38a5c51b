"""End to end: a real daphne process and a real Celery worker against PostgreSQL and
Redis; two simulated devices speaking the real protocol over real websockets."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from django.conf import settings as django_settings
from django.db import connection

from devices.models import Delivery
from devices.services import issue_pairing_code
from devices.simulator import DeviceConnection, pair, read_timeline
from tests.conftest import need, script

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def database_url_for_subprocesses() -> str:
    d = connection.settings_dict
    auth = quote(d["USER"] or "")
    if d.get("PASSWORD"):
        auth += ":" + quote(d["PASSWORD"])
    return f"postgres://{auth}@{d['HOST'] or '127.0.0.1'}:{d['PORT'] or 5432}/{d['NAME']}"


@pytest.fixture
def platform(owner: Any, brain: Any) -> Iterator[dict[str, Any]]:
    """daphne + a Celery worker, as ``./yimi up`` starts them, on the test database."""
    need(connection.vendor == "postgresql", "the end-to-end test runs on PostgreSQL (set DATABASE_URL)")
    need(bool(django_settings.REDIS_URL), "the end-to-end test needs Redis (set REDIS_URL)")
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "yimi_project.settings",
        "DATABASE_URL": database_url_for_subprocesses(),
        "REDIS_URL": django_settings.REDIS_URL,
        "YIMI_CHANNEL_PREFIX": f"yimi-e2e-{uuid.uuid4().hex[:8]}",
        "YIMI_DATA_DIR": str(django_settings.DATA_DIR),
        "YIMI_BRAIN_BASE_URL": brain.base_url,
        # Sub-agents reach the gateway over its loopback HTTP interface, as in production.
        "YIMI_GATEWAY_URL": f"http://127.0.0.1:{port}/internal/gateway",
        "YIMI_WORKSPACE_DIR": str(Path(django_settings.DATA_DIR) / "e2e-workspace"),
        "PYTHONUNBUFFERED": "1",
    }
    bindir = Path(sys.executable).parent
    logs = Path(django_settings.DATA_DIR)
    procs = [
        subprocess.Popen(
            [str(bindir / "daphne"), "-b", "127.0.0.1", "-p", str(port), "yimi_project.asgi:application"],
            cwd=ROOT, env=env, stdout=open(logs / "daphne.log", "w"), stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            [str(bindir / "celery"), "-A", "yimi_project", "worker", "--loglevel=INFO", "--concurrency=2"],
            cwd=ROOT, env=env, stdout=open(logs / "celery.log", "w"), stderr=subprocess.STDOUT,
        ),
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
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        wait_for_other_sessions_to_close()


def wait_for_other_sessions_to_close(timeout: float = 10.0) -> None:
    """Celery's pool children exit a moment after their parent; let their database
    sessions end before the test database is dropped."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0] == 0:
                return
            time.sleep(0.2)


async def test_text_from_one_device_is_answered_there_and_synced_to_another(platform: dict[str, Any], brain: Any) -> None:
    from tests.conftest import db_async

    script(brain, match="plan", reply="Your plan for today: gym at 7, lunch with Lin at 12.", chunk_chars=6)
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
        assert len(chunks) > 1 and "".join(chunks) == done["text"] == "Your plan for today: gym at 7, lunch with Lin at 12."
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

    script(brain, match="纪要", forbids_tool="workspace__write_file", reply="好，我去整理。",
           tool_calls=[{"name": "delegate", "arguments": {"goal": "把纪要写进 notes/e2e.md"}}])
    script(brain, requires_tool="workspace__write_file", reply="", tool_calls=[
        {"name": "workspace__write_file", "arguments": {"path": "notes/e2e.md", "content": "十点开会", "owner_requested": True}}])
    script(brain, when="tool", requires_tool="workspace__write_file", reply="写好了。")
    script(brain, match="Background task finished", reply="纪要写好了，一共12个字节，另外还有7个附件。")

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
