"""``manage.py memory_projections``: regenerate USER.md, MEMORY.md and PERSONALITY.md.

They are regenerated automatically after every change to their sources; this command
rewrites any that are missing or stale (``--check`` only lists them, exit 1 if any).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from accounts.services import get_owner
from memory.assertions import projections


class Command(BaseCommand):
    help = "Regenerate the read-only memory projections under DATA_DIR/memories."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--check", action="store_true", help="only list stale files; exit 1 if any")

    def handle(self, *args: Any, **options: Any) -> None:
        owner = get_owner()
        if owner is None:
            raise CommandError("no owner: run manage.py yimi_init first")
        if options["check"]:
            stale = projections.stale(owner.pk)
            self.stdout.write("stale: " + (", ".join(stale) if stale else "none"))
            if stale:
                raise CommandError("projections are stale")
            return
        written = projections.regenerate(owner.pk)
        self.stdout.write(f"{projections.memories_dir()}: " + (", ".join(written) + " written" if written else "up to date"))
