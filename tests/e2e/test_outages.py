"""Outages of what a web process depends on, for real: a daphne of this code with a TCP proxy
the test controls (tests/support/tcp_proxy.py) in front of the real Redis or the real PostgreSQL,
and a brain that does not answer. Issue 35: websocket connects refused long after a Redis
outage, health an HTML 500 during a PostgreSQL outage, and a brain outage that would have
made the release watchdog roll a good release back.

Every wait is a deadline for a poll on a busy 2-core machine, never a timed assertion."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import connection

from accounts.devices import issue_pairing_code
from devices.simulator import DeviceConnection, DeviceIdentity, SimulatorError, pair
from releases import pointers, processes
from tests.conftest import db_async, need, use_brain
from tests.support.ports import free_port
from tests.support.process_support import (
    ROOT,
    redis_prefix,
    stop_processes,
    subprocess_test_database_url,
    wait_for_sessions_to_end,
    worker_env,
)
from tests.support.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

DEADLINE_SECONDS = 60.0  # for a poll: generous, never a timed assertion
CONNECTS = 200  # devices connecting in one burst, 20 at a time


@contextlib.contextmanager
def web_process(log_name: str, env: dict[str, str]) -> Iterator[str]:
    """One daphne of this code with ``env``; yields its base URL once it accepts connections."""
    port = free_port()
    log = Path(django_settings.DATA_DIR) / log_name
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "daphne"), "-b", "127.0.0.1", "-p", str(port), "yimi_project.asgi:application"],
        cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while True:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(base + "/api/health/live/", timeout=5)
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail("daphne did not start:\n" + log.read_text()[-3000:])
            time.sleep(0.2)
        yield base
    finally:
        stop_processes([proc])


def environment(prefix: str, **overrides: str) -> dict[str, str]:
    """Production settings on the test database (sessions tagged ``prefix``), the in-memory
    channel layer unless ``overrides`` name a Redis, no embedded sweeper."""
    return worker_env(prefix, **{"REDIS_URL": "", "YIMI_EMBEDDED_SWEEPER": "0", **overrides})


async def connect_all(identity: DeviceIdentity, count: int) -> dict[str, int]:
    """``count`` connections of the device, 20 at a time, each to ``ready`` and closed again:
    how many got ``ready``, and how many were refused with each error."""
    outcomes: dict[str, int] = {}
    gate = asyncio.Semaphore(20)

    async def one() -> None:
        async with gate:
            device = DeviceConnection(identity)
            try:
                await device.connect()
                outcome = "ready"
            except SimulatorError as exc:  # the error frame before the close
                outcome = "service_unavailable" if "service_unavailable" in str(exc) else str(exc)[:120]
            except websockets.ConnectionClosed as exc:  # the close came first (before the challenge)
                outcome = "service_unavailable" if exc.rcvd is not None and exc.rcvd.code == 1013 else repr(exc)[:120]
            finally:
                with contextlib.suppress(Exception):
                    await device.close()
            outcomes[outcome] = outcomes.get(outcome, 0) + 1

    await asyncio.gather(*(one() for _ in range(count)))
    return outcomes


async def health(base: str, path: str = "/api/health/") -> tuple[int, dict[str, Any]]:
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.get(base + path)
    return response.status_code, response.json()  # JSON, whatever the status


async def until_ok(base: str, path: str = "/api/health/") -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while (answer := await health(base, path))[0] != 200:
        assert time.monotonic() < deadline, f"{path} did not come back: {answer}"
        await asyncio.sleep(0.5)


async def test_after_a_redis_outage_every_device_connects_again_at_once(owner: Any) -> None:
    """Two hundred connects fill the web process's pool of Redis connections; Redis goes
    away (every connection closed, new ones refused) and comes back. Once Redis answers
    again, the next two hundred connects all get ``ready``: none is handed a pooled
    connection that died in the outage (they got 1013 for minutes, issue 35)."""
    need(connection.vendor == "postgresql", "a daphne process shares the test database on PostgreSQL (set DATABASE_URL)")
    need(bool(django_settings.REDIS_URL), "the channel layer's Redis is what this takes away (set REDIS_URL)")
    with redis_prefix("outage") as prefix, TcpProxy.before(django_settings.REDIS_URL) as proxy:
        env = environment(prefix, REDIS_URL=proxy.url(django_settings.REDIS_URL))
        try:
            with web_process("daphne-redis-outage.log", env) as base:
                _, code = await db_async(issue_pairing_code)(owner)
                identity = await pair(base, code, kind="phone", name="outage phone")
                assert await connect_all(identity, CONNECTS) == {"ready": CONNECTS}
                proxy.drop()
                assert await connect_all(identity, 10) == {"service_unavailable": 10}  # 1013 while it is down
                assert (await health(base))[1]["reasons"] == ["channel_layer_unreachable"]
                proxy.accept()
                await until_ok(base)  # Redis answers a new connection again
                assert await connect_all(identity, CONNECTS) == {"ready": CONNECTS}
        finally:
            wait_for_sessions_to_end(prefix)


async def test_health_during_a_postgresql_outage_is_a_quick_json_503_and_ok_as_soon_as_it_is_back(owner: Any) -> None:
    """PostgreSQL goes away under a web process whose pool would wait 120 s for a connection:
    both health answers say ``database_unavailable`` in JSON (503) at once, not an HTML 500
    after the pool's wait. Once PostgreSQL is back, the first answer is ``ok``: the pool
    tried again at once, not after a backoff grown during the outage (psycopg_pool's own
    reconnect timeout, 5 minutes, had it wait 16-66 s; this process gives up a series of
    attempts after 1 s, well inside the health answer's wait for a connection)."""
    need(connection.vendor == "postgresql", "the outage is PostgreSQL's (set DATABASE_URL)")
    prefix = f"outage-pg-{owner.id}-{time.monotonic_ns()}"
    with TcpProxy.before(subprocess_test_database_url()) as proxy:
        env = environment(prefix, DATABASE_URL=proxy.url(subprocess_test_database_url()),
                          YIMI_DB_POOL_TIMEOUT_SECONDS="120", YIMI_DB_POOL_RECONNECT_SECONDS="1")
        try:
            with web_process("daphne-postgresql-outage.log", env) as base:
                status, body = await health(base)
                assert (status, body["status"], body["database"]) == (200, "ok", "postgresql"), body
                proxy.drop()
                for path in ("/api/health/", "/api/health/live/"):
                    status, body = await health(base, path)  # within the client's 30 s, far below the pool's 120 s
                    assert (status, body["status"], body["reasons"], body["database"]) == (
                        503, "degraded", ["database_unavailable"], "postgresql (unavailable)"), (path, body)
                await asyncio.sleep(8)  # long enough for psycopg_pool's own backoff to reach 8 s between attempts
                assert (await health(base))[1]["reasons"] == ["database_unavailable"]
                proxy.accept()
                for path in ("/api/health/", "/api/health/live/"):
                    status, body = await health(base, path)
                    assert (status, body["status"], body["database"]) == (200, "ok", "postgresql"), (path, body)
        finally:
            wait_for_sessions_to_end(prefix)


def test_a_brain_outage_is_readiness_degraded_but_liveness_ok_and_the_watchdog_keeps_the_release(
    owner: Any, tmp_path: Path
) -> None:
    """The brain (the model endpoint) does not answer: ``/api/health/`` is 503 ``degraded``
    with ``brain_unreachable``, ``/api/health/live/`` is 200, and the release watchdog, which
    asks the liveness URL (services.json), keeps the new release however long it watches:
    an outage outside the release is not the release's fault."""
    use_brain(f"http://127.0.0.1:{free_port()}/v1")  # nothing listens there
    prefix = f"outage-brain-{owner.id}-{time.monotonic_ns()}"
    try:
        with web_process("daphne-brain-outage.log", environment(prefix, DATABASE_URL=subprocess_test_database_url())) as base:
            readiness = httpx.get(base + "/api/health/", timeout=30)
            body = readiness.json()
            assert (readiness.status_code, body["status"], body["reasons"], body["brain_answering"]["answering"]) == (
                503, "degraded", ["brain_unreachable"], False)
            liveness = httpx.get(base + "/api/health/live/", timeout=30)
            assert (liveness.status_code, liveness.json()) == (
                200, {"status": "ok", "database": connection.vendor, "channel_layer": "in-memory", "build": None})

            root = (tmp_path / "releases").resolve()
            root.mkdir()
            (root / processes.SERVICES_FILE).write_text(json.dumps([
                {"name": "web", "argv": [sys.executable, "-c", "pass"], "health_url": base + "/api/health/live/"},
            ]))
            old, new = (pointers.ReleaseDir(path=root / n, build_id=f"dir:{n}", commit=n * 40) for n in ("a", "b"))
            for release in (old, new):
                release.path.mkdir()
                release.write()
            pointers.set_pointer(root, pointers.PREVIOUS, old)
            pointers.set_pointer(root, pointers.CURRENT, new)
            pointers.append_history(root, "switch", {"from_build": old.build_id, "to_build": new.build_id})
            for _ in range(3):  # U is 1 ms: from the second look on, an unhealthy release would be past it
                call_command("release_watchdog", "--root", str(root), "--once", "--unhealthy-seconds", "0.001",
                             "--window-seconds", "60", "--restart-limit", "3")
            assert pointers.read_pointers(root).current_build == "dir:b"
            assert [r["kind"] for r in pointers.read_history(root)] == ["switch"]
            state = json.loads((root / "watchdog-state.json").read_text())
            assert state["phase"] == "watching" and state["intent"] is None and state["unhealthy_since"] is None, state
    finally:
        if connection.vendor == "postgresql":
            wait_for_sessions_to_end(prefix)


def test_a_services_json_naming_the_readiness_url_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / processes.SERVICES_FILE).write_text(json.dumps([
        {"name": "web", "argv": ["daphne"], "health_url": "http://127.0.0.1:8000/api/health/"},
        {"name": "web2", "argv": ["daphne"], "health_url": "http://127.0.0.1:8001/api/health/live/"},
    ]))
    assert [s.name for s in processes.load_services(tmp_path)] == ["web", "web2"]
    warned = [r.yimi_fields for r in caplog.records if getattr(r, "yimi_fields", {}).get("service")]
    assert [w["service"] for w in warned] == ["web"]
