"""Hand-built SQL lives in one ``queries.py`` per app, each for its own tables.

docs/decisions/2026-12-03-sql-contained.md: every statement an app builds by hand is in
``<app>/queries.py`` (one per app, at its root); a statement that touches another app's
tables takes that part from the owning app's ``queries`` (a ``queries.py`` imports no other
app's models); hand-built SQL runs on PostgreSQL only, the ORM being the one fallback, so a
``connection.vendor`` test is left only where the databases differ by nature (locks,
rewriting tables for forgetting, backups, keyword indexes, the health check), in the modules
listed here with the reason.

The scan reads each module's syntax tree: every string constant and every literal part of
an f-string is checked against the shapes of SQL statements, so an SQL text anywhere else
fails with its module and line. Migrations are left out (their SQL is history).
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(settings.BASE_DIR)

SQL = re.compile(
    r"\bSELECT\b.+\bFROM\b|\bSELECT\s+(1|pg_|COALESCE|EXISTS)|\bINSERT\s+INTO\b|\bUPDATE\s+\S+\s+SET\b|"
    r"\bDELETE\s+FROM\b|\bWITH\s+\w+(\s*\([^)]*\))?\s+AS\s*\(|\bON\s+CONFLICT\b|\bVACUUM\b|\bPRAGMA\b"
)

# Modules outside a queries.py that may hold SQL text or test the database vendor, and why:
# each is something the two databases do differently by nature, not a faster path.
BY_NATURE = {
    "memory/locks.py": "advisory locks on PostgreSQL, a process lock on SQLite",
    "memory/assertions/forget_compaction.py": "rewriting tables so forgotten bytes leave the disk differs per database",
    "memory/management/commands/forget_compact.py": "reports which rewrite ran",
    "releases/backup.py": "pg_dump or SQLite's backup API",
    "releases/idle.py": "open write transactions are read from pg_stat_activity",
    "yimi_project/views.py": "the readiness check's SELECT 1",
}

# Framework patches (yimi_project/infra) build SQL generically, from any model's _meta.
SKIPPED_PARTS = {"migrations", "infra", "__pycache__"}


def apps() -> list[str]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return list(tomllib.load(f)["tool"]["importlinter"]["root_packages"])


def modules() -> Iterator[tuple[str, Path]]:
    for app in apps():
        for path in sorted((ROOT / app).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if SKIPPED_PARTS.intersection(rel.parts):
                continue
            yield app, path


def sql_texts(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Each string constant (docstrings aside) and each f-string, its replacement fields
    read as ``{}``, that has the shape of an SQL statement."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings | parts:
            text = node.value
        else:
            continue
        text = " ".join(str(text).split())
        if SQL.search(text):
            yield node.lineno, text[:80]


def vendor_tests(tree: ast.AST) -> Iterator[int]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "vendor":
            yield node.lineno


def test_one_queries_module_per_app_at_its_root() -> None:
    stray = [str(p.relative_to(ROOT)) for app in apps() for p in (ROOT / app).rglob("queries.py") if p.parent != ROOT / app]
    assert stray == [], f"an app's hand-built SQL goes in <app>/queries.py, not: {stray}"


def test_sql_text_only_in_queries_modules() -> None:
    found = []
    for _, path in modules():
        rel = str(path.relative_to(ROOT))
        if path.name == "queries.py" or rel in BY_NATURE:
            continue
        found += [f"{rel}:{line}: {text}" for line, text in sql_texts(ast.parse(path.read_text(), rel))]
    assert found == [], "SQL text outside an app's queries.py (move it there):\n" + "\n".join(found)


def test_vendor_tested_only_where_databases_differ_by_nature() -> None:
    found = []
    for _, path in modules():
        rel = str(path.relative_to(ROOT))
        if path.name == "queries.py" or rel in BY_NATURE:
            continue
        found += [f"{rel}:{line}" for line in vendor_tests(ast.parse(path.read_text(), rel))]
    assert found == [], (
        "connection.vendor tested outside queries.py and the by-nature modules (PostgreSQL takes the hand-built "
        "statement from <app>.queries, every other database the ORM):\n" + "\n".join(found)
    )


def test_queries_modules_read_only_their_own_apps_models() -> None:
    found = []
    for app, path in modules():
        if path.name != "queries.py":
            continue
        tree = ast.parse(path.read_text())
        typing_only = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:  # names for annotations, never run
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                top, *rest = node.module.split(".")
                if top != app and top in apps() and "models" in rest:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import ...")
    assert found == [], (
        "a queries.py builds statements for its own app's tables; another app's part comes from that app's "
        "queries module:\n" + "\n".join(found)
    )


@pytest.mark.parametrize("text", [
    "SELECT id FROM brain_run WHERE id = %s",
    "INSERT INTO memory_timelineentry (seq) VALUES (%s)",
    'UPDATE "brain_run" SET "state" = %s',
    "WITH claimed AS (UPDATE x SET y = 1 RETURNING *) SELECT * FROM claimed",
])
def test_the_scan_sees_sql(text: str) -> None:
    assert list(sql_texts(ast.parse(f"x = {text!r}"))) != []
    assert list(sql_texts(ast.parse(f"x = f{text.replace('%s', '{value}')!r}"))) != []  # as an f-string too


@pytest.mark.parametrize("text", ["Select a model", "update the settings", "the run was selected from the lane"])
def test_the_scan_passes_prose(text: str) -> None:
    assert list(sql_texts(ast.parse(f"x = {text!r}"))) == []


def test_the_scan_passes_docstrings() -> None:
    assert list(sql_texts(ast.parse('def f():\n    """INSERT INTO the timeline, then SELECT x FROM y."""\n'))) == []


@pytest.mark.parametrize("rel", sorted(BY_NATURE))
def test_each_by_nature_module_still_needs_its_place(rel: str) -> None:
    """A module listed as differing by nature still tests the vendor or holds SQL text (a stale
    entry would let a new hot path in unnoticed)."""
    tree = ast.parse((ROOT / rel).read_text())
    assert list(vendor_tests(tree)) or list(sql_texts(tree)), f"{rel} no longer differs by database: drop it from BY_NATURE"
