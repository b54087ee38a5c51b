from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from accounts.devices import issue_pairing_code
from accounts.services import get_owner


class Command(BaseCommand):
    help = "Print a new single-use pairing code (valid 10 minutes)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--guest", action="store_true", help="devices paired with it speak in scope guest")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            owner = get_owner()
        except DatabaseError:
            raise CommandError("this instance is not set up yet: run ./yimi up (or manage.py yimi_init) first") from None
        if owner is None:
            raise CommandError("no owner yet: run ./yimi up (or manage.py yimi_init) first")
        _, code = issue_pairing_code(owner, for_guest=opts["guest"])
        self.stdout.write(code)
