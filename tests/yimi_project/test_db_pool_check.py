"""The connection pool's health check (yimi_project/infra/db_pool.py, README "Database
connections"): a connection the server closed is never handed to a request, and a healthy
one is handed out without a round trip to ask."""

from __future__ import annotations

import os
import resource
import time
from typing import Any

import psycopg
import pytest
from django.db import connection

from tests.conftest import need
from tests.support.process_support import database_url_for_subprocesses
from yimi_project.infra.db_pool import check_pooled_connection

pytestmark = pytest.mark.django_db(transaction=True)  # autocommit: the request's connection comes from the pool

EVERY = 10.0  # seconds between empty queries on a connection nothing else says is broken
GONE_DEADLINE_SECONDS = 30.0  # a poll's limit, not a timed assertion


class CountingConnection(psycopg.Connection[Any]):
    """A psycopg connection that counts the statements sent on it (the check's empty query among them)."""

    sent = 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        self.sent += 1
        return super().execute(*args, **kwargs)


def open_counting() -> CountingConnection:
    return CountingConnection.connect(database_url_for_subprocesses(), autocommit=True)


def terminate(pids: list[int]) -> None:
    """End these backends from another session and wait until they are gone."""
    with psycopg.connect(database_url_for_subprocesses(), autocommit=True) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        deadline = time.monotonic() + GONE_DEADLINE_SECONDS
        while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]).fetchone() != (0,):
            assert time.monotonic() < deadline, f"backends {pids} did not end"
            time.sleep(0.05)


@pytest.fixture
def postgres() -> None:
    need(connection.vendor == "postgresql", "the connection pool is PostgreSQL's (set DATABASE_URL)")


def test_a_healthy_connection_confirmed_lately_is_handed_out_without_a_round_trip(postgres: None) -> None:
    with open_counting() as conn:
        check_pooled_connection(conn, every_seconds=EVERY, now=100.0)  # never confirmed: asks once
        assert conn.sent == 1
        check_pooled_connection(conn, every_seconds=EVERY, now=100.0 + EVERY - 0.5)
        assert conn.sent == 1


def test_a_connection_not_confirmed_for_the_interval_is_asked_again(postgres: None) -> None:
    with open_counting() as conn:
        check_pooled_connection(conn, every_seconds=EVERY, now=100.0)
        check_pooled_connection(conn, every_seconds=EVERY, now=100.0 + EVERY)
        assert conn.sent == 2


def test_a_connection_the_server_ended_fails_the_check_at_once(postgres: None) -> None:
    with open_counting() as conn:
        check_pooled_connection(conn, every_seconds=EVERY, now=100.0)
        terminate([conn.info.backend_pid])
        with pytest.raises(psycopg.OperationalError):  # well inside the interval: the socket told
            check_pooled_connection(conn, every_seconds=EVERY, now=100.5)


def test_a_connection_on_a_descriptor_above_1024_is_checked_too(postgres: None) -> None:
    """A web process with many sockets open gets database sockets above select()'s
    FD_SETSIZE: the check must work there (a check that raised for every connection would
    have the pool discard them all)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need(hard == resource.RLIM_INFINITY or hard > 1200, f"the descriptor limit ({hard}) leaves no room above 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200) if hard == resource.RLIM_INFINITY else min(max(soft, 1200), hard), hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1030)]
    try:
        with open_counting() as conn:
            assert conn.pgconn.socket > 1024
            check_pooled_connection(conn, every_seconds=EVERY, now=100.0)  # asks once, passes
            check_pooled_connection(conn, every_seconds=EVERY, now=100.5)  # handed out as it is
            assert conn.sent == 1
            terminate([conn.info.backend_pid])
            with pytest.raises(psycopg.OperationalError):
                check_pooled_connection(conn, every_seconds=EVERY, now=101.0)
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_closed_connection_fails_the_check(postgres: None) -> None:
    conn = open_counting()
    conn.close()
    with pytest.raises(psycopg.OperationalError):
        check_pooled_connection(conn, every_seconds=EVERY, now=100.0)


def test_a_connection_killed_server_side_is_not_handed_to_a_request(postgres: None) -> None:
    """Every backend of the test database is ended (the pool's idle connections among
    them) right after use; the next query still runs, on a new connection."""
    assert connection.pool is not None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (used,) = cursor.fetchone()
    connection.close()  # back to the pool, confirmed moments ago
    with psycopg.connect(database_url_for_subprocesses(), autocommit=True) as admin:
        pids = [pid for (pid,) in admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()]
    assert used in pids
    terminate(pids)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (now_used,) = cursor.fetchone()
    assert now_used not in pids


def test_a_request_after_every_idle_connection_was_ended_gets_a_new_one_without_waiting_out_the_pool(postgres: None) -> None:
    """Eight idle connections in the pool, all ended by the server at once (a restart): the
    first failed check sweeps the others, so the request does not wait a doubling delay per
    dead connection (1 + 2 + 4 + 8 + 16 s is past the pool's 30 s) and gets a new one."""
    import threading

    from django.db import connections

    pool = connection.pool
    assert pool is not None
    holders = 8
    barrier = threading.Barrier(holders)

    def hold() -> None:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1")
            barrier.wait(timeout=GONE_DEADLINE_SECONDS)  # all eight checked out at once
        connections["default"].close()  # back to the pool, idle

    threads = [threading.Thread(target=hold) for _ in range(holders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert pool.get_stats()["pool_available"] >= holders
    with psycopg.connect(database_url_for_subprocesses(), autocommit=True) as admin:
        pids = [pid for (pid,) in admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()]
    assert len(pids) >= holders
    terminate(pids)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (now_used,) = cursor.fetchone()
    assert now_used not in pids
