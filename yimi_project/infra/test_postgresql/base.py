"""The test suite's PostgreSQL backend (``test_settings``): the production settings' backend
(``YIMI_TEST_BASE_DB_ENGINE``), except how a transactional test's database is emptied when
the test ends.

Django empties it with one ``TRUNCATE`` of every table (``flush``). PostgreSQL gives each
truncated table, its indexes and its TOAST table new files, so with ~90 tables and ~400
indexes that costs ~0.5 s per test even when the test wrote three rows. Here the same
``flush`` deletes the rows instead, in one server-side statement:

1. lock every table in SHARE ROW EXCLUSIVE mode, so a session still writing (a thread or
   subprocess of the test) finishes first, as it would before ``TRUNCATE``;
2. ``DELETE FROM`` each table. Django's foreign keys are DEFERRABLE INITIALLY DEFERRED, so the
   order does not matter: they are checked when the flush commits, by which time every
   table is empty.

Sequences are not reset, as ``TRUNCATE`` without ``RESTART IDENTITY`` leaves them; a test that
asks for reset sequences (``reset_sequences=True``) gets Django's own statements.
Production never uses this backend.

Patches: Django's ``DatabaseOperations.sql_flush`` for the test database only (ENGINE in
``test_settings``). Why: the truncating flush cost ~0.5 s per transactional test
(docs/decisions/2026-12-03-test-database-flush.md). Drop it when Django's flush stops
giving every table new files, or the suite stops paying for it.
Tests: tests/yimi_project/test_test_database_flush.py; figure: bench/flush.py."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from django.conf import settings

base = import_module(f"{settings.YIMI_TEST_BASE_DB_ENGINE}.base")


class DatabaseOperations(base.DatabaseWrapper.ops_class):  # type: ignore[name-defined,misc]
    def sql_flush(self, style: Any, tables: list[str], *, reset_sequences: bool = False, allow_cascade: bool = False) -> list[str]:
        if reset_sequences or not tables:
            return super().sql_flush(style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        quoted = ", ".join(self.quote_name(table) for table in tables)
        # A dollar-quoted block: no table name can end it (Django's names are identifiers).
        deletes = "\n".join(f"  DELETE FROM {self.quote_name(table)};" for table in tables)
        return [f"DO $flush$\nBEGIN\n  LOCK TABLE {quoted} IN SHARE ROW EXCLUSIVE MODE;\n{deletes}\nEND\n$flush$"]


class DatabaseWrapper(base.DatabaseWrapper):  # type: ignore[name-defined,misc]
    ops_class = DatabaseOperations
