"""Flush benchmark: how long a transactional test's database flush takes, DELETE (the test suite's) vs TRUNCATE (Django's).

    .venv/bin/python bench/flush.py [--database-url postgres://...] [--rounds 3] [--per-round 5]

A fresh PostgreSQL database (``yimi_bench_flush`` by default, dropped and created) with every
migration, under ``yimi_project.test_settings`` (the test suite's backend,
``yimi_project/infra/test_postgresql``). Before each flush one ``accounts_user`` row is written;
then the tables are emptied by the suite's flush (``sql_flush`` of that backend: one DELETE per
table in one block) or by Django's (one TRUNCATE of every table), alternating in rounds. The
floor row is the ORM's delete of the one row written. Prints p50 and max wall ms per flush and
the load average (docs/decisions/2026-12-03-test-database-flush.md). Run on demand.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import recreate_database  # noqa: E402


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/yimi_bench_flush")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-round", type=int, default=5)
    args = parser.parse_args()
    recreate_database(args.database_url)
    os.environ.update(DJANGO_SETTINGS_MODULE="yimi_project.test_settings", DATABASE_URL=args.database_url,
                      YIMI_DATA_DIR=tempfile.mkdtemp(prefix="yimi-bench-flush-"))
    os.environ.pop("REDIS_URL", None)
    import django

    django.setup()
    from django.core.management import call_command
    from django.core.management.color import no_style
    from django.db import connection

    from accounts.models import User

    call_command("migrate", verbosity=0)
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    ops = connection.ops
    djangos = type(ops).__mro__[1].sql_flush  # the production backend's, under the suite's

    def write() -> None:
        User.objects.create_user(username=f"u{time.perf_counter_ns()}", password="not-used")

    def flush_with(build: Callable[[], list[str]]) -> Callable[[], float]:
        def flush() -> float:
            write()
            started = time.perf_counter()
            ops.execute_sql_flush(build())
            return (time.perf_counter() - started) * 1000
        return flush

    def floor() -> float:
        write()
        started = time.perf_counter()
        User.objects.all().delete()
        return (time.perf_counter() - started) * 1000

    rows: dict[str, Callable[[], float]] = {
        "DELETE (the suite's flush)": flush_with(lambda: ops.sql_flush(no_style(), tables)),
        "TRUNCATE (Django's flush)": flush_with(lambda: djangos(ops, no_style(), tables)),
        "floor: ORM delete of the row": floor,
    }
    for fn in rows.values():  # warm-up
        fn()
    before = load()
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, fn in rows.items():
            samples[name] += [fn() for _ in range(args.per_round)]
    print(f"flush: {len(tables)} tables, {args.rounds} rounds x {args.per_round} per row; load average (1 min) {before}/{load()}")
    for name, values in samples.items():
        print(f"{name:<32}p50 {statistics.median(values):>9.1f} ms   max {max(values):>9.1f} ms")


if __name__ == "__main__":
    main()
