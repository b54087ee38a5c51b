"""The owner's memory lock, named in one place.

Every L3 write (commit, forget) and every projection rewrite runs inside a transaction
that first takes this lock, so writes for one owner happen one at a time and a
projection is always rendered from the latest committed state.

- PostgreSQL: ``pg_advisory_xact_lock(MEMORY_LOCK_SPACE, owner_id)``, released when the
  transaction ends (commit or rollback). Other owners are not blocked.
- SQLite (the embedded default): the settings open every transaction with
  ``BEGIN IMMEDIATE``, which already holds the database's single write lock for the
  whole transaction, so there is nothing more to take.
"""

from __future__ import annotations

from django.db import connection

# Two-key advisory locks: (space, owner id). 0x4D454D = "MEM".
MEMORY_LOCK_SPACE = 0x4D454D


def lock_owner_memory(owner_id: int) -> None:
    """Take the owner's memory write lock until the current transaction ends."""
    if not connection.in_atomic_block:
        raise RuntimeError("lock_owner_memory must be called inside transaction.atomic()")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [MEMORY_LOCK_SPACE, int(owner_id)])
