"""``manage.py yimi_init``: make this instance ready, idempotently.

Migrates, creates the instance identity (Ed25519) and the owner account if they are
missing, and prints a fresh pairing code. Running it again changes nothing that exists
(it only issues another single-use pairing code, unless ``--no-pairing-code``). It is
devices' command because it ends with pairing, which accounts/, a layer below, cannot import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from accounts.identity import ensure_instance_identity, instance_public_key_b64
from accounts.services import ensure_owner, get_owner
from devices.services import issue_pairing_code


class Command(BaseCommand):
    help = "Migrate, create the instance identity and the owner if missing, print a pairing code."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--owner-username", default="owner")
        parser.add_argument("--owner-password-file", help="read the owner's password from this file")
        parser.add_argument("--no-pairing-code", action="store_true")
        parser.add_argument("--guest-code", action="store_true", help="the pairing code is for a guest device")

    def handle(self, *args: Any, **opts: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write(f"database: migrated ({settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]})")

        created = ensure_instance_identity()
        self.stdout.write(
            f"instance identity: {'created' if created else 'kept'} ({instance_public_key_b64()}) in {settings.DATA_DIR}"
        )

        password = None
        if opts["owner_password_file"]:
            try:
                password = Path(opts["owner_password_file"]).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise CommandError(f"cannot read the owner password file: {exc}") from exc
            if not password:
                raise CommandError("the owner password file is empty")
        made = ensure_owner(opts["owner_username"], password)
        if made is None:
            self.stdout.write(f"owner: kept ({get_owner().get_username()})")  # type: ignore[union-attr]
        elif made.password:
            self.stdout.write(f"owner: created {made.user.get_username()!r}, password (shown once): {made.password}")
        else:
            self.stdout.write(f"owner: created {made.user.get_username()!r} with the password from the file")

        if not opts["no_pairing_code"]:
            _, code = issue_pairing_code(get_owner(), for_guest=opts["guest_code"])
            kind = "guest pairing code" if opts["guest_code"] else "pairing code"
            self.stdout.write(f"{kind} (single use, valid 10 minutes): {code}")
