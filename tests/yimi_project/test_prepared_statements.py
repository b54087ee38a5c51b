"""On PostgreSQL a statement that runs again on a connection is prepared there, so the
server stops parsing and planning it (yimi_project/settings.py, YIMI_DB_PREPARE_THRESHOLD;
issue 14: planning was a third of PostgreSQL's CPU per text)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.db import connection

from tests.support.process_support import ROOT
from yimi_project.infra import statements

pytestmark = pytest.mark.django_db


def prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_a_repeated_statement_is_prepared_on_its_connection() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    threshold = connection.connection.prepare_threshold
    assert threshold == 5  # settings' default
    sql = "SELECT %s::int + 40 AS yimi_prepare_probe"
    for n in range(threshold + 1):
        assert not [s for s in prepared_statements() if "yimi_prepare_probe" in s], n
        with connection.cursor() as cursor:
            cursor.execute(sql, [n])
            assert cursor.fetchone() == (n + 40,)
    assert [s for s in prepared_statements() if "yimi_prepare_probe" in s]  # the run after the threshold prepared it


@pytest.mark.parametrize(("value", "expected"), [("", "None"), ("7", "7")])
def test_the_threshold_comes_from_the_environment(value: str, expected: str) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    code = "from django.conf import settings; print(settings.DATABASES['default']['OPTIONS']['prepare_threshold'])"
    env = {"DJANGO_SETTINGS_MODULE": "yimi_project.settings", "DATABASE_URL": "postgres://u@127.0.0.1:5432/x", "YIMI_DB_PREPARE_THRESHOLD": value}
    result = subprocess.run([sys.executable, "-c", f"import django; django.setup(); {code}"], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == expected


def test_statements_in_custom_plans_are_never_prepared() -> None:
    """The keyword search runs in ``statements.custom_plans``: PostgreSQL plans it with each
    run's own values (a rare term and a common one want different plans), and the
    connection prepares again after it."""
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    threshold = connection.connection.prepare_threshold
    sql = "SELECT %s::int + 1 AS yimi_custom_probe"
    with statements.custom_plans():
        for n in range(threshold + 3):
            with connection.cursor() as cursor:
                cursor.execute(sql, [n])
    assert not [s for s in prepared_statements() if "yimi_custom_probe" in s]
    assert connection.connection.prepare_threshold == threshold
