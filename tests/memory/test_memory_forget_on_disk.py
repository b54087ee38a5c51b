"""Forgetting on disk (docs/memory.md "Forgetting on disk"): after a forget the erased texts
are still bytes in the table files (dead tuples, free space in pages); ``manage.py
forget_compact`` rewrites the tables so they are not. The files themselves are read: on
PostgreSQL each table's relation files (``pg_relation_filepath``: the heap, its TOAST table
and every index), directly or through ``pg_read_binary_file``; on SQLite the database file."""

from __future__ import annotations

import base64
import io
import os
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection

from brain.services import accept_utterance
from capabilities.models import ToolCall
from memory import copies
from memory.assertions import forget_compaction
from memory.assertions import store as assertions
from memory.assertions.store import CommitRequest
from tests.conftest import need, new_client_id
from yimi_project.errors import YimiError

# What forget writes, checked by name: the issue found the texts in these three.
ISSUE_TABLES = ("memory_assertion", "memory_assertionversion", "capabilities_toolcall")


def relation_paths(cursor: Any, table: str) -> list[str]:
    """The files of ``table`` relative to the data directory: its heap, its TOAST table, the
    TOAST table's index and every index of the table (segment 0 of each)."""
    cursor.execute(
        """
        WITH t AS (SELECT oid, reltoastrelid FROM pg_class WHERE oid = %s::regclass)
        SELECT pg_relation_filepath(oid) FROM t
        UNION ALL SELECT pg_relation_filepath(reltoastrelid) FROM t WHERE reltoastrelid <> 0
        UNION ALL SELECT pg_relation_filepath(i.indexrelid) FROM pg_index i, t
                  WHERE i.indrelid = t.oid OR (t.reltoastrelid <> 0 AND i.indrelid = t.reltoastrelid)
        """,
        [table],
    )
    return [path for (path,) in cursor.fetchall() if path]


class PgFiles:
    """Reads relation files: directly where this process may (a local server, as root), else
    with ``pg_read_binary_file`` (a superuser or pg_read_server_files), else the test cannot
    look and is skipped (a failure in CI)."""

    def __init__(self, cursor: Any) -> None:
        self.cursor = cursor
        cursor.execute("SELECT current_setting('data_directory', true)")
        directory = cursor.fetchone()[0]
        self.directory = Path(directory) if directory and os.access(directory, os.R_OK | os.X_OK) else None
        if self.directory is None:
            try:
                cursor.execute("SELECT pg_read_binary_file('PG_VERSION')")
            except DatabaseError:
                need(False, "the test cannot read PostgreSQL's files (not local, or not a superuser)")

    def read(self, path: str) -> bytes:
        """Every segment of the relation (``path``, ``path.1``, …); b"" for a removed file."""
        data, segment = b"", 0
        while True:
            name = path if segment == 0 else f"{path}.{segment}"
            chunk = self._read_one(name)
            if chunk is None:
                return data
            data += chunk
            segment += 1

    def _read_one(self, name: str) -> bytes | None:
        if self.directory is not None:
            try:
                return (self.directory / name).read_bytes()
            except FileNotFoundError:
                return None
        self.cursor.execute("SELECT pg_read_binary_file(%s, 0, 1073741824, true)", [name])
        found = self.cursor.fetchone()[0]
        return None if found is None else bytes(found)


def texts_in_files(markers: list[str], tables: list[str]) -> dict[str, set[str]]:
    """``{marker: {files that hold it}}``, after a CHECKPOINT (what is in shared buffers is
    written to the files first)."""
    found: dict[str, set[str]] = {m: set() for m in markers}
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("CHECKPOINT")
            files = PgFiles(cursor)
            for table in tables:
                for path in relation_paths(cursor, table):
                    data = files.read(path)
                    for marker in markers:
                        if marker.encode() in data:
                            found[marker].add(f"{table}:{path}")
        else:
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
            name = connection.settings_dict["NAME"]
            for path in (Path(name), Path(f"{name}-wal"), Path(f"{name}-journal")):
                data = path.read_bytes() if path.is_file() else b""
                for marker in markers:
                    if marker.encode() in data:
                        found[marker].add(path.name)
    return found


def incompressible(size: int) -> str:
    return base64.b64encode(os.urandom(size)).decode()  # neither pglz nor lz4 compresses it: stored as written


@pytest.mark.django_db(transaction=True)
def test_forgotten_texts_stay_in_the_table_files_until_forget_compact_rewrites_them(owner: Any, make_device: Any) -> None:
    need(connection.vendor in ("postgresql", "sqlite"), "a PostgreSQL or SQLite database")
    short = f"forget-me-{uuid.uuid4().hex}"  # inline in the row
    long = f"forget-me-long-{uuid.uuid4().hex}"  # in the TOAST table (PostgreSQL) / overflow pages (SQLite)
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA secure_delete = OFF")  # as SQLite builds without SECURE_DELETE do (Debian's has it on)
    run = accept_utterance(make_device().device, new_client_id(), "帮我记一件事")
    first = assertions.commit(CommitRequest(owner.pk, "c-1", "preference.food", {"text": f"{short} 不吃香菜"}, 0)).assertion_id
    second = assertions.commit(CommitRequest(owner.pk, "c-2", "preference.food", {"text": f"{long} {incompressible(6000)}"}, 0)).assertion_id
    ToolCall.objects.create(owner=owner, run_id=run.run_id, tool="memory__commit", category="owner_data", fingerprint="f" * 64,
                            idempotency_key="k", decision="allow", arguments={"payload": {"text": f"{short} 不吃香菜"}})
    assertions.forget(owner.pk, first, request_id="f-1")
    assertions.forget(owner.pk, second, request_id="f-2")
    assert short not in str(ToolCall.objects.get().arguments)  # redacted in the rows...

    tables = forget_compaction.tables()
    assert set(ISSUE_TABLES) <= set(tables)
    before = texts_in_files([short, long], tables)
    assert before[short] and before[long], before  # ...but still bytes in the files
    if connection.vendor == "postgresql":
        assert {f.split(":")[0] for f in before[short]} >= {"memory_assertionversion", "capabilities_toolcall"}, before
        assert any(":" in f and f.startswith("memory_assertionversion") for f in before[long])

    out = io.StringIO()
    call_command("forget_compact", stdout=out)

    after = texts_in_files([short, long], tables)
    assert after == {short: set(), long: set()}, after
    said = out.getvalue()
    assert "checkpoint: done" in said and "still holding the old bytes" in said
    assert ("WAL segments" in said) == (connection.vendor == "postgresql") and "backups" in said
    if connection.vendor == "postgresql":
        assert all(f"VACUUM FULL {t} " in said for t in ISSUE_TABLES)
        with connection.cursor() as cursor:  # the files that held them before are emptied, not just left behind
            files = PgFiles(cursor)
            assert all(short.encode() not in files.read(f.split(":", 1)[1]) for f in before[short])


def older_transaction() -> Any:
    """Another session of the test database, in a transaction that holds a transaction id
    and a snapshot (as a request still running, or a session left idle in transaction)."""
    import psycopg

    params = connection.settings_dict
    other = psycopg.connect(dbname=params["NAME"], user=params["USER"], password=params["PASSWORD"] or None,
                            host=params["HOST"] or None, port=params["PORT"] or None)
    other.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    pid = other.execute("SELECT pg_backend_pid(), pg_current_xact_id()").fetchone()[0]
    return other, pid


@pytest.mark.django_db(transaction=True)
def test_rows_an_older_transaction_may_still_see_are_waited_for_and_never_silently_kept(owner: Any, monkeypatch: Any) -> None:
    need(connection.vendor == "postgresql", "PostgreSQL (VACUUM FULL keeps rows older transactions may see)")
    other, pid = older_transaction()
    try:
        aid = assertions.commit(CommitRequest(owner.pk, "c-1", "preference.food", {"text": "forget-me too"}, 0)).assertion_id
        assertions.forget(owner.pk, aid, request_id="f-1")
        with pytest.raises(YimiError) as still_open:
            forget_compaction.compact(wait_seconds=0)
        assert still_open.value.code == "transactions_open" and f"pid {pid} (" in still_open.value.message

        # Had it not waited, VACUUM FULL would have copied the erased rows: its own count says so.
        monkeypatch.setattr(forget_compaction, "_wait_for_older_transactions", lambda *args: None)
        with pytest.raises(YimiError) as kept:
            forget_compaction.compact()
        assert kept.value.code == "dead_rows_kept" and kept.value.message.startswith("memory_assertion")
        monkeypatch.undo()

        said: list[str] = []

        def sleep(seconds: float) -> None:  # the older transaction ends while the command waits
            if not other.closed:
                other.commit()
                other.close()
            time.sleep(seconds)

        result = forget_compaction.compact(wait_seconds=120, progress=said.append, sleep=sleep)
        assert result.checkpoint == "done" and "waiting for" in said[0] and said[-1] == "CHECKPOINT"
    finally:
        other.close()


def test_the_sqlite_rewrite_takes_a_deleted_text_out_of_the_file(tmp_path: Path) -> None:
    """The SQLite path on its own database file, whatever database the suite runs on."""
    path = tmp_path / "db.sqlite3"
    marker = f"forget-me-{uuid.uuid4().hex}"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA secure_delete = OFF")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT)")
    db.execute("INSERT INTO t (payload) VALUES (?), (?)", (f"{marker} kept?", "another row"))
    db.execute("INSERT INTO t (payload) VALUES (?)", (f"{marker} {incompressible(9000)}",))  # overflow pages
    db.execute("UPDATE t SET payload = NULL WHERE payload LIKE ?", (f"{marker}%",))
    assert marker.encode() in path.read_bytes()  # erased in the rows, not in the file
    assert forget_compaction.compact_sqlite(db.cursor()) == "done"
    assert marker.encode() not in path.read_bytes()
    assert db.execute("SELECT count(*) FROM t").fetchone() == (3,)
    db.close()


def test_every_app_that_keeps_copies_names_its_tables() -> None:
    """A redactor registered without its models would leave its table out of forget_compact."""
    models = copies.copy_models()
    assert set(models) == set(copies.redactors())
    assert all(models[app] for app in models), models
    assert {"capabilities_toolcall", "capabilities_receiptrecord", "consent_consentcard", "brain_agenttask",
            "brain_callsnapshot", "memory_ambientrecord", *ISSUE_TABLES} <= set(forget_compaction.tables())


@pytest.mark.django_db
def test_forget_compact_refuses_inside_a_transaction() -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError) as refused:
        call_command("forget_compact", stdout=io.StringIO())  # a non-transactional test runs inside one
    assert "(in_transaction)" in str(refused.value)
    out = io.StringIO()
    call_command("forget_compact", "--list", stdout=out)
    assert out.getvalue().split() == forget_compaction.tables()
