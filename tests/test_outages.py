"""Outages of what a web process depends on, for real: a daphne of this code with a TCP proxy
the test controls (tests/tcp_proxy.py) in front of the real Redis. Issue 35: websocket
connects refused long after a Redis outage.

Every wait is a deadline for a poll on a busy 2-core machine, never a timed assertion."""

from __future__ import annotations

import asyncio
import contextlib
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
from django.db import connection

from devices.services import issue_pairing_code
from devices.simulator import DeviceConnection, DeviceIdentity, SimulatorError, pair
from tests.conftest import db_async, need
from tests.ports import free_port
from tests.process_support import (
    ROOT,
    redis_prefix,
    stop_processes,
    wait_for_sessions_to_end,
    worker_env,
)
from tests.tcp_proxy import TcpProxy

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
                httpx.get(base + "/api/health/", timeout=5)
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
