"""The owner's locks, named in one place.

Each is a transaction-scoped lock per owner: taken inside ``transaction.atomic()``,
released when the transaction ends (commit or rollback); other owners are not blocked.

- ``lock_owner_memory``: every L3 write (commit, forget) and every projection rewrite, so
  writes for one owner happen one at a time and a projection is always rendered from the
  latest committed state.
- ``lock_owner_calls``: the gateway's ``decide`` from its duplicate check to the recorded
  call (with its card or payment authorization), so two identical calls cannot both pass
  the duplicate, in-flight or waiting-card check before either is recorded.
- ``lock_owner_payments``: issuing a payment authorization (the small auto-pay daily sum
  and same-payee check, then the insert), so concurrent auto-payments are counted.

- ``archive_round_lock``: one cold-pack migration round at a time per owner
  (``memory.archive.cold_store``). Not transaction-scoped: a round uploads for seconds and holds no
  transaction, so it is a *session* lock, tried (a second round returns at once) and
  released when the round ends; in-process (a thread lock) on SQLite.

Order, where more than one is held: calls, then payments (``decide`` asking for a payment
authorization). Memory's lock is never held together with the others.

- PostgreSQL: ``pg_advisory_xact_lock(space, owner_id)``.
- SQLite (the embedded default): the settings open every transaction with
  ``BEGIN IMMEDIATE``, which already holds the database's single write lock for the
  whole transaction, so there is nothing more to take.

The statements are in ``memory.queries``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection

from memory import queries

# Two-key advisory locks: (space, owner id).
MEMORY_LOCK_SPACE = 0x4D454D  # "MEM"
CALLS_LOCK_SPACE = 0x43414C  # "CAL"
PAYMENTS_LOCK_SPACE = 0x504159  # "PAY"
ARCHIVE_LOCK_SPACE = 0x415243  # "ARC"


def lock_owner(space: int, owner_id: int) -> None:
    """Take the owner's lock in ``space`` until the current transaction ends."""
    if not connection.in_atomic_block:
        raise RuntimeError("an owner lock must be taken inside transaction.atomic()")
    # By nature, not speed: PostgreSQL has advisory locks; SQLite's BEGIN IMMEDIATE already holds the write lock.
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(queries.ADVISORY_XACT_LOCK_SQL, [space, int(owner_id)])


def lock_owner_memory(owner_id: int) -> None:
    """Take the owner's memory write lock until the current transaction ends."""
    lock_owner(MEMORY_LOCK_SPACE, owner_id)


def lock_owner_calls(owner_id: int) -> None:
    """Take the owner's gateway lock (``decide``) until the current transaction ends."""
    lock_owner(CALLS_LOCK_SPACE, owner_id)


def lock_owner_payments(owner_id: int) -> None:
    """Take the owner's payment authorization lock until the current transaction ends."""
    lock_owner(PAYMENTS_LOCK_SPACE, owner_id)


_archive_threads = threading.Lock()


@contextmanager
def archive_round_lock(owner_id: int) -> Iterator[bool]:
    """Try the owner's archive round lock; yields whether it was taken (released on exit)."""
    if connection.vendor != "postgresql":  # by nature: no advisory locks here, one process's threads take turns
        taken = _archive_threads.acquire(blocking=False)
        try:
            yield taken
        finally:
            if taken:
                _archive_threads.release()
        return
    with connection.cursor() as cursor:
        cursor.execute(queries.ADVISORY_TRY_LOCK_SQL, [ARCHIVE_LOCK_SPACE, int(owner_id)])
        taken = bool(cursor.fetchone()[0])
    try:
        yield taken
    finally:
        if taken:
            with connection.cursor() as cursor:
                cursor.execute(queries.ADVISORY_UNLOCK_SQL, [ARCHIVE_LOCK_SPACE, int(owner_id)])
