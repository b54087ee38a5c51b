"""The health check of the PostgreSQL connection pool (settings ``OPTIONS["pool"]["check"]``).

psycopg_pool's own ``ConnectionPool.check_connection`` (what Django installs with
``CONN_HEALTH_CHECKS``) sends an empty query on every checkout: a round trip to the
server each time a request, a websocket frame or a task borrows a connection, so one more
trip per database call on the hot paths. ``check_pooled_connection`` asks the server only
when there is a reason to:

1. the connection is closed or not idle as psycopg sees it: refused (the pool discards it
   and hands out another);
2. its socket is readable: an idle connection in the pool has nothing to read unless the
   server spoke first — when the server ends a backend (``pg_terminate_backend``, a
   restart, an idle timeout) it sends the error and closes the socket, so it is readable
   at once. Then the empty query decides (it raises on a closed connection, and passes
   on a harmless asynchronous message such as a notice);
3. no empty query has confirmed it for ``YIMI_DB_POOL_CHECK_EVERY_SECONDS``: the empty
   query, so a connection whose server went away without a word is still found, if later;
4. otherwise it is handed out as it is, without a round trip.

A connection that fails the check is discarded by the pool, which gives the request
another one, and the pool's other idle connections are swept with it
(``PooledConnectionCheck``; tests/yimi_project/test_db_pool_check.py).

Replaces: psycopg_pool's ``ConnectionPool.check_connection``, the check Django installs with
``CONN_HEALTH_CHECKS``; settings put ``pooled_connection_check`` in ``OPTIONS["pool"]`` and
the backend ``yimi_project.infra.postgresql`` hands it to the pool. Why: one round trip per
checkout on every hot path, and after a restart psycopg_pool's doubling delay per failed
check made a request wait out the pool's 30 s
(docs/decisions/2026-12-03-postgresql-statements-and-pool.md). Drop it when psycopg_pool checks a connection leaving the pool without a round trip and
sweeps its idle connections once one fails; settings then go back to ``CONN_HEALTH_CHECKS``.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq
from psycopg_pool import ConnectionPool

CONFIRMED_AT = "_yimi_confirmed_at"  # attribute on the connection: when the empty query last passed


class PooledConnectionCheck:
    """The pool's ``check`` callback: ``check_pooled_connection`` with this interval and clock.

    When a connection fails it, the pool's other idle connections are swept at once
    (``ConnectionPool.check``: each asked, the broken ones replaced) before the pool hands out
    the next. The server usually closed them all together (a restart, a terminated database),
    and psycopg_pool waits a doubling delay after each failed check (1, 2, 4, 8, 16 s): with
    five dead idle connections a request waited out the pool's 30 s and failed.
    ``yimi_project.infra.postgresql`` binds the pool (``sweeps``)."""

    def __init__(self, every_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_seconds = every_seconds
        self.clock = clock
        self.pool: ConnectionPool | None = None

    def sweeps(self, pool: ConnectionPool) -> None:
        self.pool = pool

    def __call__(self, conn: Any) -> None:
        try:
            check_pooled_connection(conn, every_seconds=self.every_seconds, now=self.clock())
        except psycopg.Error:
            if self.pool is not None:
                self.pool.check()
            raise


def pooled_connection_check(every_seconds: float, clock: Callable[[], float] = time.monotonic) -> PooledConnectionCheck:
    """The ``check`` for ``OPTIONS["pool"]`` (settings)."""
    return PooledConnectionCheck(every_seconds, clock)


def check_pooled_connection(conn: Any, *, every_seconds: float, now: float) -> None:
    """Raise if ``conn`` (a psycopg connection leaving the pool) must not be handed out.
    Steps in the module docstring."""
    pgconn = conn.pgconn
    if conn.closed or pgconn.status != pq.ConnStatus.OK or pgconn.transaction_status != pq.TransactionStatus.IDLE:
        raise psycopg.OperationalError("the pooled connection is closed or not idle")
    # poll, not select: a web process with many sockets open has descriptors above
    # select's FD_SETSIZE (1024), where select raises for every connection.
    poller = select.poll()
    poller.register(pgconn.socket, select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP)
    readable = bool(poller.poll(0))
    if not readable and now - getattr(conn, CONFIRMED_AT, float("-inf")) < every_seconds:
        return
    ConnectionPool.check_connection(conn)  # psycopg_pool's empty query: raises on a connection the server closed
    setattr(conn, CONFIRMED_AT, now)
