"""``manage.py yimi_init``: make this instance ready, idempotently.

Migrates, creates the instance identity (Ed25519), the model master key and the owner
account if they are missing, imports the model settings from the environment on the
first start only (``brain.roles.import_from_environment``), and prints a fresh pairing
code. Running it again changes nothing that exists
(it only issues another single-use pairing code, unless ``--no-pairing-code``). It is
devices' command because it ends with pairing, which accounts/, a layer below, cannot import.
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from accounts.identity import ensure_instance_identity, instance_public_key_b64
from accounts.services import ensure_owner, get_owner
from brain import keyring, roles
from devices.services import issue_pairing_code
from yimi_project.errors import YimiError


class Command(BaseCommand):
    help = "Migrate, create the instance identity and the owner if missing, print a pairing code."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--owner-username", default="owner")
        parser.add_argument("--owner-password-file", help="read the owner's password from this file")
        parser.add_argument("--no-pairing-code", action="store_true")
        parser.add_argument("--guest-code", action="store_true", help="the pairing code is for a guest device")
        parser.add_argument(
            "--check-ports",
            action="store_true",
            help="first check that YIMI_HOST:YIMI_PORT (and, with --demo-brain, YIMI_FAKE_BRAIN_PORT) are free and no Yimi answers on YIMI_INTERNAL_SOCKET (./yimi up)",
        )
        parser.add_argument("--demo-brain", action="store_true", help="with --check-ports: the demo brain will start too")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["check_ports"]:
            # Before anything else: a second `./yimi up` must fail without issuing a pairing code.
            check_port_free(settings.YIMI_HOST, settings.YIMI_PORT, "YIMI_PORT", "Yimi")
            if opts["demo_brain"]:
                check_port_free("127.0.0.1", settings.FAKE_BRAIN_PORT, "YIMI_FAKE_BRAIN_PORT", "the demo brain")
            # Another Yimi on another port but this data directory: `./yimi up` would remove its
            # internal listener's socket (and both would share one SQLite file).
            check_internal_socket_free(Path(settings.YIMI_INTERNAL_SOCKET))
        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write(f"database: migrated ({settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]})")

        created = ensure_instance_identity()
        self.stdout.write(
            f"instance identity: {'created' if created else 'kept'} ({instance_public_key_b64()}) in {settings.DATA_DIR}"
        )

        created = keyring.ensure_master_key()
        self.stdout.write(f"model master key: {'created' if created else 'kept'} ({keyring.master_key_path()})")
        try:
            imported = roles.import_from_environment()
        except YimiError as exc:
            raise CommandError(f"model settings: {exc.message} ({exc.code})") from None
        if imported is None:
            self.stdout.write("model settings: kept (imported at first start; the environment is not read again)")
        else:
            self.stdout.write(f"model settings: imported from the environment ({', '.join(imported)})")

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


def check_port_free(host: str, port: int, variable: str, what: str) -> None:
    """Raise a one-line ``CommandError`` if nothing can listen on ``host:port``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise CommandError(
                    f"port {port} on {host} ({what}) is in use: is Yimi already running? "
                    f"Stop it (Ctrl-C in its terminal) or set {variable} to a free port"
                ) from None
            raise CommandError(f"cannot listen on {host}:{port} ({what}): {exc.strerror}; set {variable}") from None


def check_internal_socket_free(path: Path) -> None:
    """Raise a one-line ``CommandError`` if a running Yimi answers on the internal listener's
    Unix socket ``path``; a socket left behind by one that stopped is not in use."""
    if not path.is_socket():
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        try:
            sock.connect(str(path))
        except OSError:
            return  # nothing accepts there: left behind, `./yimi up` replaces it
    raise CommandError(
        f"the internal listener {path} answers: another Yimi is running on this data directory "
        f"({settings.DATA_DIR}). Stop it (Ctrl-C in its terminal) or set YIMI_DATA_DIR to another directory"
    )
