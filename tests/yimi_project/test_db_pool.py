"""A burst of requests against a real daphne on PostgreSQL uses at most the process's
connection pool, and the service answers again right after it (docs: README "Database
connections")."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from django.conf import settings as django_settings
from django.db import connection

from tests.conftest import need
from tests.support.ports import free_port
from tests.support.process_support import ROOT, database_url_for_subprocesses

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

POOL_MAX_SIZE = 6
BURST = 300  # requests, all in flight at once, to loopback only
HEALTHY_DEADLINE_SECONDS = 120.0  # generous: a deadline for the poll, not a timed assertion


async def count_connections(conn: psycopg.AsyncConnection[Any], application_name: str) -> int:
    cursor = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (application_name,))
    row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def burst_and_recover(base: str, application_name: str) -> dict[str, Any]:
    """Send BURST concurrent GET /api/health/ while sampling the server's connections; then
    poll until health answers 200."""
    figures: dict[str, Any] = {"max_connections_used": 0}
    stop = asyncio.Event()

    async def sample() -> None:
        async with await psycopg.AsyncConnection.connect(database_url_for_subprocesses(), autocommit=True) as conn:
            while not stop.is_set():
                figures["max_connections_used"] = max(figures["max_connections_used"], await count_connections(conn, application_name))
                await asyncio.sleep(0.02)
            figures["connections_after"] = await count_connections(conn, application_name)

    sampler = asyncio.ensure_future(sample())
    limits = httpx.Limits(max_connections=BURST, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(180.0)) as client:

        async def one() -> str:
            try:
                return str((await client.get(base + "/api/health/")).status_code)
            except httpx.HTTPError as exc:
                return type(exc).__name__

        started = time.monotonic()
        outcomes = await asyncio.gather(*(one() for _ in range(BURST)))
        figures["burst_seconds"] = round(time.monotonic() - started, 2)
        figures["outcomes"] = {o: outcomes.count(o) for o in sorted(set(outcomes))}

        after = time.monotonic()
        while True:
            try:
                if (await client.get(base + "/api/health/", timeout=5)).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() - after < HEALTHY_DEADLINE_SECONDS, "health did not answer 200 after the burst"
            await asyncio.sleep(0.2)
        figures["seconds_to_healthy"] = round(time.monotonic() - after, 2)
    stop.set()
    await sampler
    return figures


def test_a_burst_of_requests_uses_at_most_the_pool_and_health_answers_after_it(owner: Any) -> None:
    need(connection.vendor == "postgresql", "the connection pool is PostgreSQL's (set DATABASE_URL)")
    port = free_port()
    application_name = f"yimi-pool-test-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "yimi_project.settings",
        "DATABASE_URL": database_url_for_subprocesses(),
        "YIMI_DATA_DIR": str(django_settings.DATA_DIR),
        "YIMI_DB_POOL_MAX_SIZE": str(POOL_MAX_SIZE),
        "PGAPPNAME": application_name,  # libpq tags every connection daphne opens
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("REDIS_URL", None)  # the database is what this measures
    log = Path(django_settings.DATA_DIR) / "daphne-pool.log"
    daphne = subprocess.Popen(
        [str(Path(sys.executable).parent / "daphne"), "-b", "127.0.0.1", "-p", str(port), "yimi_project.asgi:application"],
        cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/api/health/", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or daphne.poll() is not None:
                pytest.fail("daphne did not start:\n" + log.read_text()[-3000:])
            time.sleep(0.2)

        figures = asyncio.run(burst_and_recover(base, application_name))
        print(f"\npool max_size {POOL_MAX_SIZE}, burst of {BURST}: {figures}")
        assert 1 <= figures["max_connections_used"] <= POOL_MAX_SIZE, figures
        assert figures["connections_after"] <= POOL_MAX_SIZE, figures
    finally:
        daphne.terminate()
        try:
            daphne.wait(10)
        except subprocess.TimeoutExpired:
            daphne.kill()
