"""The test database's flush (yimi_project/infra/test_postgresql, wired by ``test_settings``):
a transactional test's tables are emptied by DELETE, keeping their files, not truncated (which
gives every table and index new files, ~0.5 s per test; docs/decisions/2026-12-03-test-database-flush.md)."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection

from accounts.models import User
from tests.conftest import need

pytestmark = pytest.mark.django_db(transaction=True)


def _files(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT relfilenode FROM pg_class WHERE oid = %s::regclass", [table])
        (node,) = cursor.fetchone()
    return int(node)


def test_the_flush_a_transactional_test_ends_with_empties_tables_but_keeps_their_files() -> None:
    need(connection.vendor == "postgresql", "the flush is PostgreSQL's (set DATABASE_URL)")
    table = User._meta.db_table
    first = User.objects.create_user(username="flushed", password="not-used-here")
    before = _files(table)
    call_command("flush", interactive=False, verbosity=0, reset_sequences=False, inhibit_post_migrate=True)  # as a teardown
    assert not User.objects.exists()
    assert _files(table) == before  # DELETE, not TRUNCATE: the same files
    again = User.objects.create_user(username="flushed", password="not-used-here")
    assert again.pk > first.pk  # sequences are not reset, as TRUNCATE without RESTART IDENTITY
