"""``manage.py memory_import``: import existing core-memory files into Yimi's memory.

    memory_import --memory ~/.hermes/memories/MEMORY.md --user ~/.hermes/memories/USER.md

Each entry (one per line, or per section: ``§`` separators or markdown headings) becomes
a ``core_profile.entry`` assertion; running it again imports only entries added since.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from accounts.models import User
from accounts.services import get_owner
from memory.assertions.core_import import import_entries


class Command(BaseCommand):
    help = "Import MEMORY.md / USER.md entries as core_profile.entry assertions (only new entries on later runs)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--memory", type=Path, help="a MEMORY.md file (entries go to MEMORY.md)")
        parser.add_argument("--user", type=Path, help="a USER.md file (entries go to USER.md)")
        parser.add_argument("--owner", help="username of the owner (default: the instance's owner)")

    def handle(self, *args: Any, **options: Any) -> None:
        owner = User.objects.filter(username=options["owner"]).first() if options["owner"] else get_owner()
        if owner is None:
            raise CommandError("no owner: run manage.py yimi_init first (or pass --owner)")
        files = [(doc, options[doc]) for doc in ("memory", "user") if options[doc]]
        if not files:
            raise CommandError("give --memory and/or --user")
        refused = 0
        for doc, path in files:
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise CommandError(f"cannot read {path}: {exc}") from None
            report = import_entries(owner.pk, text, doc=doc)
            self.stdout.write(f"{path.name}: {len(report.imported)} new, {report.already} already imported, {len(report.refused)} refused")
            for reason in report.refused:
                self.stdout.write(f"  refused: {reason}")
            refused += len(report.refused)
        if refused:
            raise CommandError(f"{refused} entries were refused")
