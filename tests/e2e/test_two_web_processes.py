"""Two web processes behind one port, as ``./yimi up`` starts them with
``YIMI_WEB_PROCESSES=2`` (``yimi_project.web_processes``: each daphne on its own
``SO_REUSEPORT`` socket, the first also on the internal listener), plus a Celery worker, on
PostgreSQL and Redis. A device whose socket process A accepted and a device on process B
share one timeline, get their own replies, and a revocation made on A closes B's socket."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings as django_settings
from django.db import connection

from accounts.devices import issue_pairing_code
from devices.simulator import DeviceConnection, DeviceIdentity, pair
from tests.conftest import db_async, need, script
from tests.support.ports import free_port
from tests.support.process_support import ROOT, celery_worker, redis_prefix, stop_processes, worker_env
from yimi_project.web_processes import refusal

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# Past the channel layer's 5 s blocking pop and redis-py's 5 s read timeout, twice.
IDLE_SECONDS = 12.0
START_SECONDS = 60.0


def serving_pid(server_port: int, client_port: int, pids: list[int]) -> int | None:
    """Which of ``pids`` holds the server end of the loopback TCP connection from
    ``client_port`` to ``server_port`` (read from ``/proc``: the kernel chose the process)."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
            inode = fields[9]
            break
    if inode is None:
        return None
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        for fd in fd_dir.iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) == f"socket:[{inode}]":
                    return pid
    return None


class WebProcesses:
    def __init__(self, port: int, procs: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
        self.port = port
        self.procs = procs
        self.logs = logs
        self.base = f"http://127.0.0.1:{port}"

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def tail(self) -> str:
        return "\n".join(f"--- {log.name} ---\n{log.read_text(errors='replace')[-2000:]}" for log in self.logs)

    async def device_on(self, index: int, identity: DeviceIdentity) -> DeviceConnection:
        """A connected device whose socket the kernel gave to process ``index``
        (reconnecting until it lands there)."""
        wanted = self.procs[index].pid
        for _ in range(64):
            conn = DeviceConnection(identity)
            await conn.connect()
            if serving_pid(self.port, conn.ws.local_address[1], self.pids) == wanted:
                return conn
            await conn.close()
        pytest.fail(f"64 connections never reached web process {index}")

    def http_client_on(self, index: int) -> httpx.Client:
        """An HTTP client whose kept-alive connection process ``index`` accepted."""
        wanted = self.procs[index].pid
        for _ in range(64):
            client = httpx.Client(base_url=self.base, timeout=30)
            response = client.get("/api/health/")
            if serving_pid(self.port, self.client_port(response), self.pids) == wanted:
                return client
            client.close()
        pytest.fail(f"64 connections never reached web process {index}")

    @staticmethod
    def client_port(response: httpx.Response) -> int:
        return int(response.extensions["network_stream"].get_extra_info("client_addr")[1])


@pytest.fixture
def web(owner: Any, brain: Any, settings: Any, tmp_path: Path) -> Iterator[WebProcesses]:
    need(connection.vendor == "postgresql", "two web processes run on PostgreSQL (set DATABASE_URL)")
    need(bool(django_settings.REDIS_URL), "two web processes need Redis (set REDIS_URL)")
    port = free_port()
    internal = Path(django_settings.DATA_DIR) / "sockets" / f"web2-{port}.sock"
    internal.parent.mkdir(parents=True, exist_ok=True)
    extra = {
        "YIMI_BRAIN_BASE_URL": brain.base_url,
        "YIMI_GATEWAY_OVER_HTTP": "1",
        "YIMI_INTERNAL_SOCKET": str(internal),
        "YIMI_WORKSPACE_DIR": str(tmp_path / "workspace"),
    }
    with redis_prefix("web2") as prefix, celery_worker(prefix, tmp_path / "celery.log", **extra):
        env = worker_env(prefix, **extra)
        procs: list[subprocess.Popen[bytes]] = []
        logs = [tmp_path / "web-a.log", tmp_path / "web-b.log"]
        try:
            for index, log in enumerate(logs):
                args = [sys.executable, "-m", "yimi_project.web_processes", "serve", "127.0.0.1", str(port)]
                if index == 0:
                    args += ["--internal-socket", str(internal)]
                procs.append(subprocess.Popen(args, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT))
            web = WebProcesses(port, procs, logs)
            deadline = time.monotonic() + START_SECONDS
            while not all("Listening on" in log.read_text() or "Configuring endpoint" in log.read_text() for log in logs):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    pytest.fail("the web processes did not start:\n" + web.tail())
                time.sleep(0.2)
            # Both answer on the port (the kernel picks one per connection).
            while True:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    if httpx.get(web.base + "/api/health/", timeout=2).json()["channel_layer"] == "redis":
                        break
                if time.monotonic() > deadline:
                    pytest.fail("the web processes do not answer:\n" + web.tail())
                time.sleep(0.2)
            yield web
        finally:
            stop_processes(procs)
            # Their database sessions share the worker's tag (prefix): celery_worker waits
            # for them all once the worker is stopped too.


def revoke_in_admin(web: WebProcesses, index: int, device_id: str) -> None:
    """The owner revokes a device from the admin, every request served by process ``index``."""
    client = web.http_client_on(index)
    with contextlib.closing(client):
        wanted = web.procs[index].pid

        def served_there(response: httpx.Response) -> httpx.Response:
            assert serving_pid(web.port, web.client_port(response), web.pids) == wanted, "the request moved to another process"
            return response

        served_there(client.get("/admin/login/?next=/admin/"))
        response = served_there(client.post("/admin/login/?next=/admin/", data={
            "username": "owner", "password": "correct horse battery",
            "csrfmiddlewaretoken": client.cookies["csrftoken"], "next": "/admin/",
        }))
        assert response.status_code == 302, response.text[:500]
        served_there(client.get("/admin/accounts/device/"))
        response = served_there(client.post("/admin/accounts/device/", data={
            "action": "revoke", "_selected_action": device_id, "select_across": "0", "index": "0",
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        }))
        assert response.status_code == 302, response.text[:500]


def test_more_than_one_web_process_is_refused_on_the_embedded_default() -> None:
    sqlite = {"default": {"ENGINE": "django.db.backends.sqlite3"}}
    postgres = {"default": {"ENGINE": "django.db.backends.postgresql"}}
    in_memory = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    redis_layer = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer"}}
    assert refusal(1, sqlite, in_memory) is None
    assert refusal(2, postgres, redis_layer) is None
    for databases, layers in [(sqlite, in_memory), (sqlite, redis_layer), (postgres, in_memory)]:
        reason = refusal(2, databases, layers)
        assert reason is not None and reason.startswith("YIMI_WEB_PROCESSES=2 refused") and "\n" not in reason
    # ./yimi up says it in one line and starts nothing (the embedded default: no DATABASE_URL, no REDIS_URL).
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env["YIMI_DATA_DIR"] = str(Path(django_settings.DATA_DIR) / "refused")
    done = subprocess.run([sys.executable, "-m", "yimi_project.web_processes", "check", "2"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "SQLite" in done.stderr and "REDIS_URL" in done.stderr


async def test_devices_on_two_web_processes_share_timeline_replies_and_revocation(web: WebProcesses, brain: Any, owner: Any, settings: Any) -> None:
    # The owner's password hashed as the web processes (production settings) can check it.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    owner.set_password("correct horse battery")
    await db_async(owner.save)()
    script(brain, match="plan", reply="Gym at seven, lunch with Lin.", chunk_chars=6)
    script(brain, match="weather", reply="Sunny all day.", chunk_chars=5)
    (_, phone_code), (_, mac_code) = [await db_async(issue_pairing_code)(owner) for _ in range(2)]
    phone = await pair(web.base, phone_code, kind="phone", name="phone on A")
    mac = await pair(web.base, mac_code, kind="mac", name="mac on B", capture_channels=["mac"])

    on_a = await web.device_on(0, phone)
    on_b = await web.device_on(1, mac)
    try:
        # A text on A: B hears of it (timeline.new through Redis) and syncs it; A gets the reply.
        ack = await on_a.say("What is my plan today?")
        assert ack["seq"] == 1
        heard = await on_b.next_frame("timeline.new", timeout=30)
        assert heard["seq"] >= 1
        try:
            chunks, done = await on_a.reply_to(ack["seq"], timeout=60)
        except Exception:
            print(web.tail())
            raise
        assert done["type"] == "reply.done", (done, (web.logs[0].parent / "celery.log").read_text()[-3000:])
        assert "".join(chunks) == done["text"] == "Gym at seven, lunch with Lin."
        entries = await on_b.sync(after=0)
        assert [(e["seq"], e["kind"], e["text"]) for e in entries] == [
            (1, "utterance", "What is my plan today?"), (2, "reply", "Gym at seven, lunch with Lin."),
        ]
        assert entries[0]["device_id"] == phone.device_id

        # Both sockets idle past the channel layer's and redis-py's timeouts, then a text on B:
        # its reply comes back to B, and A syncs it.
        await asyncio.sleep(IDLE_SECONDS)
        for conn in (on_a, on_b):
            assert conn.closed is not None and not conn.closed.done()
        ack_b = await on_b.say("And the weather?")
        assert ack_b["seq"] == 3
        chunks_b, done_b = await on_b.reply_to(ack_b["seq"], timeout=60)
        assert done_b["type"] == "reply.done" and "".join(chunks_b) == done_b["text"] == "Sunny all day."
        assert [e["seq"] for e in await on_a.sync(after=2)] == [3, 4]

        # The owner revokes the mac from the admin on process A: B closes its socket (4403).
        await asyncio.to_thread(revoke_in_admin, web, 0, mac.device_id)
        assert on_b.closed is not None
        code, _ = await asyncio.wait_for(on_b.closed, 30)
        assert code == 4403
        # The phone on A is untouched.
        await on_a.send({"type": "ping", "id": "still-here"})
        assert (await on_a.next_frame("pong"))["id"] == "still-here"
    finally:
        await on_a.close()
        await on_b.close()
