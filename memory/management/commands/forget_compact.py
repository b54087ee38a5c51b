"""``manage.py forget_compact``: after forgetting, rewrite the tables that held the
forgotten texts so their bytes leave the table files (``memory.assertions.forget_compaction``;
docs/memory.md "Forgetting on disk").

PostgreSQL: ``VACUUM FULL`` of each table (with its TOAST table and indexes), then
``CHECKPOINT``. SQLite: ``VACUUM`` of the whole file with ``secure_delete`` on, then the WAL
truncated. Each table is locked while it is rewritten: run it when Yimi is quiet. It first
waits (``--wait``, 60 s) for the transactions older than itself to end: rows they may still
see cannot be dropped. It prints what still holds the old bytes (WAL, archives, backups).
``--list`` only names the tables.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from memory.assertions import forget_compaction
from yimi_project.errors import YimiError


class Command(BaseCommand):
    help = "Rewrite the tables a forget wrote (VACUUM FULL + CHECKPOINT; SQLite: VACUUM) so forgotten texts leave their files."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--list", action="store_true", help="only list the tables that would be rewritten")
        parser.add_argument("--wait", type=float, default=60.0,
                            help="seconds to wait for transactions older than the command to end (PostgreSQL; default 60)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["list"]:
            for name in forget_compaction.tables():
                self.stdout.write(name)
            return
        try:
            result = forget_compaction.compact(wait_seconds=options["wait"], progress=lambda line: self.stdout.write(f"  {line}"))
        except YimiError as exc:
            raise CommandError(f"{exc.message} ({exc.code})") from None
        what = "the whole database file" if result.vendor == "sqlite" else f"{len(result.tables)} tables"
        self.stdout.write(f"rewrote {what}: {', '.join(result.tables)}")
        self.stdout.write(f"checkpoint: {result.checkpoint}")
        self.stdout.write("still holding the old bytes, beyond this command:")
        for place in result.still_holding:
            self.stdout.write(f"  - {place}")
