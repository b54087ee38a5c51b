"""Forgetting on disk (docs/memory.md "Forgetting on disk"): rewriting the tables a forget
wrote, so the forgotten bytes leave their table files.

``assertions.forget`` erases payloads with UPDATEs, inside a transaction. Neither database
overwrites the old row where it stood: PostgreSQL leaves the old tuple in the page (dead,
later reclaimed for reuse by VACUUM, but its bytes stay until something is written over
them), in the table's TOAST table when the value was long, and in the WAL; SQLite leaves the
old cell in free space inside its page (unless ``secure_delete`` was on) and in its WAL
file. ``compact`` rewrites every table that held a copy:

- PostgreSQL: ``VACUUM FULL`` of each table writes a new file with only the live rows,
  together with its TOAST table and its indexes; the old files are truncated when each
  VACUUM commits (and unlinked at the next checkpoint). A row erased after some
  transaction still open began is "recently dead" and copied too (that transaction may
  still read it), in any database of the cluster: so the command first waits for the
  transactions older than itself to end, and checks VACUUM's own count of the dead rows
  it kept. Then ``CHECKPOINT``: the rewritten
  tables are on disk, and the WAL before it (which still holds the old rows) may be
  recycled — recycled segments keep their bytes until PostgreSQL writes over them, and WAL
  archives and backups keep theirs.
- SQLite: ``PRAGMA secure_delete = ON`` for the connection, ``VACUUM`` (the whole database
  file is rebuilt from its live rows), then ``PRAGMA wal_checkpoint(TRUNCATE)``, which
  empties the WAL file.

The tables: memory's own (``MEMORY_MODELS``) and the ones each app named when it registered
its redactor (``memory.copies.register(..., models=...)``). ``VACUUM FULL`` holds an
ACCESS EXCLUSIVE lock on each table while it rewrites it: requests that touch it wait.
The statements' text is in ``memory.queries``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.db import connection
from django.db.utils import DatabaseError

from memory import copies, queries
from yimi_project.errors import YimiError

# Memory's own tables that a forget writes: the tombstones (summary cleared), the versions
# (payload erased), and the sessions whose stored prompt blocks it drops.
MEMORY_MODELS = ("memory.Assertion", "memory.AssertionVersion", "memory.MemorySession")


@dataclass
class CompactResult:
    vendor: str
    tables: list[str]
    checkpoint: str  # "done", or why it was not
    still_holding: list[str] = field(default_factory=list)  # what the command cannot reach


def tables() -> list[str]:
    """Every table a forget writes a copy out of, by name, each once, in a fixed order."""
    labels = [*MEMORY_MODELS, *(label for _app, models in sorted(copies.copy_models().items()) for label in models)]
    names: list[str] = []
    for label in labels:
        name = apps.get_model(label)._meta.db_table
        if name not in names:
            names.append(name)
    return names


POSTGRESQL_LEFT = [
    "WAL segments written before the checkpoint (recycled, not wiped: overwritten as PostgreSQL reuses them)",
    "archived WAL (archive_command), streaming replicas' own files, and any base backup or pg_dump taken before",
    "backups made by manage.py release (data directory backups/)",
    "disk blocks the filesystem freed when the old table files were truncated",
]
SQLITE_LEFT = [
    "backups and copies of the database file made before (data directory backups/)",
    "disk blocks the filesystem freed when the file was rebuilt",
]


KEPT = re.compile(r"(\d+) dead row versions cannot be removed yet")


def compact(
    *,
    table_names: list[str] | None = None,
    wait_seconds: float = 0.0,
    progress: Callable[[str], None] = lambda _line: None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> CompactResult:
    """Rewrite the tables (default ``tables()``) so no forgotten byte is left in their files.

    Steps: 1. refuse inside a transaction (neither VACUUM may run in one:
    ``in_transaction``); PostgreSQL: 2. wait up to ``wait_seconds`` for every transaction
    that began before this call to end (``memory.queries.OLDER_SESSIONS_SQL``; still open:
    ``transactions_open``, naming them: end them and run it again); 3. ``VACUUM (FULL,
    VERBOSE)`` each table, reading from its report how many dead row versions it had to
    keep (any: ``dead_rows_kept``); 4. ``CHECKPOINT`` (without the privilege for it —
    superuser or ``pg_checkpoint`` — the tables are still rewritten, and the result says the
    next automatic checkpoint does it). SQLite: ``compact_sqlite``. The result names what
    still holds the old bytes."""
    if connection.in_atomic_block:
        raise YimiError("in_transaction", "the tables cannot be rewritten inside a transaction")
    names = table_names if table_names is not None else tables()
    with connection.cursor() as cursor:
        # Each database rewrites its tables its own way (a difference by nature, not speed).
        if connection.vendor == "sqlite":
            return CompactResult("sqlite", names, compact_sqlite(cursor, progress), SQLITE_LEFT)
        if connection.vendor != "postgresql":
            raise YimiError("unsupported_database", f"rewriting tables is not implemented for {connection.vendor}")
        _wait_for_older_transactions(cursor, wait_seconds, progress, sleep, clock)
        notices: list[str] = []
        raw = connection.connection

        def heard(diag: Any) -> None:
            notices.append(f"{diag.message_primary or ''}\n{diag.message_detail or ''}")

        raw.add_notice_handler(heard)
        try:
            for name in names:
                progress(f"VACUUM FULL {name} (with its TOAST table and indexes)")
                notices.clear()
                cursor.execute(queries.vacuum_full_sql(name))
                kept = sum(int(n) for text in notices for n in KEPT.findall(text))
                if kept:
                    raise YimiError("dead_rows_kept", f"{name}: {kept} dead row version(s) had to be kept for a transaction "
                                                      "that may still see them; end it and run this again")
        finally:
            raw.remove_notice_handler(heard)
        checkpoint = "done"
        progress("CHECKPOINT")
        try:
            cursor.execute(queries.CHECKPOINT_SQL)
        except DatabaseError as exc:  # insufficient privilege: the rewrite stands
            checkpoint = f"not allowed for this database user ({str(exc).strip().splitlines()[0][:160]}); the next automatic checkpoint does it"
        return CompactResult("postgresql", names, checkpoint, POSTGRESQL_LEFT)


def _wait_for_older_transactions(cursor: Any, wait_seconds: float, progress: Callable[[str], None],
                                 sleep: Callable[[float], None], clock: Callable[[], float]) -> None:
    """Step 2 of ``compact``: ``t0`` is a transaction id taken now (every forget already
    committed has an older one); wait, polling once a second, until no session, prepared
    transaction or replication slot older than it is left."""
    cursor.execute(queries.CURRENT_XID_SQL)
    t0 = cursor.fetchone()[0]
    deadline = clock() + wait_seconds
    while True:
        cursor.execute(queries.OLDER_SESSIONS_SQL, {"t0": t0})
        older = [row[0] for row in cursor.fetchall()]
        if not older:
            return
        if clock() >= deadline:
            raise YimiError("transactions_open", "transactions older than this command may still see the forgotten rows, "
                                                 "so they cannot be dropped yet: " + "; ".join(older[:10]))
        progress(f"waiting for {len(older)} older transaction(s) to end")
        sleep(1.0)


def compact_sqlite(cursor: Any, progress: Callable[[str], None] = lambda _line: None) -> str:
    """SQLite's rewrite on any DB-API cursor of the database, outside a transaction:
    ``secure_delete`` on (from now on this connection zeroes what it deletes), ``VACUUM``
    (the file rebuilt from its live rows: free pages and the free space inside pages are
    gone), ``wal_checkpoint(TRUNCATE)`` (the WAL file, if any, emptied). Returns how the
    checkpoint went."""
    cursor.execute(queries.SQLITE_SECURE_DELETE_SQL)
    progress("VACUUM (the whole database file, secure_delete on)")
    cursor.execute(queries.SQLITE_VACUUM_SQL)
    progress("PRAGMA wal_checkpoint(TRUNCATE)")
    cursor.execute(queries.SQLITE_CHECKPOINT_SQL)
    busy = cursor.fetchone()
    return "done" if not busy or not busy[0] else "busy: another connection is reading; run the command again"
