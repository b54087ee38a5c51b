"""``manage.py yimi_init``: make this instance ready, idempotently.

Migrates, creates the instance identity (Ed25519), the model master key and the owner
account if they are missing, imports the model settings from the environment on the
first start only (``llm.roles.import_from_environment``), records the shipped packs in
the pack registry (``record_shipped_versions``: a new version when a release changed
one), grants the shipped packs the secrets they were made for
(``capabilities.registry.grants.grant_shipped_secrets``; a revoked grant stays revoked),
and prints a fresh pairing code. Running it again changes nothing that exists (it only
issues another single-use pairing code, unless ``--no-pairing-code``). It is devices'
command because it ends with pairing, which accounts/, a layer below, cannot import.

For ``./yimi up``: ``--check-ports`` checks every port it binds (the web port, the demo brain's
when a stored role points at it, the cold storage's) before the owner password or a pairing
code is printed; ``--demo-brain-ports-file`` tells it which demo brain to start, from the
stored settings. On a later start, an environment that names another brain than the stored
one gets one paragraph with the command that drafts the change (``environment_note``).
"""

from __future__ import annotations

import errno
import os
import shlex
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from accounts.devices import issue_pairing_code
from accounts.identity import ensure_instance_identity, instance_public_key_b64
from accounts.services import ensure_owner, get_owner
from capabilities.registry.grants import grant_shipped_secrets
from capabilities.registry.publish import record_shipped_versions
from capabilities.registry_models import RegisteredPack
from llm import keyring, roles
from yimi_project.errors import YimiError
from yimi_project.secrets import read_secret, read_secret_file


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
            help="check that every port ./yimi up binds is free before printing the owner password or a pairing code: "
                 "YIMI_HOST:YIMI_PORT, the demo brain's port(s) when a stored model role points at it, the cold "
                 "storage's (--cold-webdav-port), and that no Yimi answers on YIMI_INTERNAL_SOCKET",
        )
        parser.add_argument("--cold-webdav-port", type=int, help="with --check-ports: ./yimi up starts the local cold storage on this port")
        parser.add_argument(
            "--demo-brain-ports-file",
            help="write the ports of the demo brain to start, one a line (none when no stored model role points at it): "
                 "what ./yimi up reads to decide",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["check_ports"]:
            # Before anything else: a second `./yimi up` must fail without issuing a pairing code.
            check_port_free(settings.YIMI_HOST, settings.YIMI_PORT, "YIMI_PORT", "Yimi")
            # Another Yimi on another port but this data directory: `./yimi up` would remove its
            # internal listener's socket (and both would share one SQLite file).
            check_internal_socket_free(Path(settings.YIMI_INTERNAL_SOCKET))
            if opts["cold_webdav_port"] is not None:
                check_port_free("127.0.0.1", opts["cold_webdav_port"], "YIMI_COLD_WEBDAV_PORT", "the cold storage")
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
            note = environment_note()
            if note:
                self.stdout.write(note)
        else:
            self.stdout.write(f"model settings: imported from the environment ({', '.join(imported)})")
        recorded = record_shipped_versions()
        self.stdout.write(f"packs: {RegisteredPack.objects.count()} registered ({len(recorded)} shipped version(s) recorded now)")
        granted = grant_shipped_secrets()
        self.stdout.write(f"pack secrets: {len(granted)} granted to shipped packs now; manage.py pack grants lists them")

        # The demo brain runs when a stored role points at it, whatever the environment says now.
        demo_ports = roles.demo_brain_ports()
        if opts["check_ports"]:
            for port in demo_ports:  # still before the owner password and the pairing code
                check_port_free("127.0.0.1", port, "YIMI_FAKE_BRAIN_PORT", "the demo brain, where the stored model settings point")
        if opts["demo_brain_ports_file"]:
            Path(opts["demo_brain_ports_file"]).write_text("".join(f"{port}\n" for port in demo_ports), encoding="utf-8")
        if demo_ports and demo_ports != [settings.FAKE_BRAIN_PORT]:
            self.stdout.write(
                f"demo brain: on port {', '.join(map(str, demo_ports))}, where the stored model settings point "
                f"(YIMI_FAKE_BRAIN_PORT, {settings.FAKE_BRAIN_PORT}, is read at the first start only)"
            )

        password = None
        if opts["owner_password_file"]:
            password = read_secret_file(opts["owner_password_file"], "the owner password file")
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


def manage_command() -> str:
    """How to run manage.py here: ``.venv/bin/python manage.py`` in a checkout ``./yimi up`` set up."""
    venv = Path(settings.BASE_DIR) / ".venv"
    return ".venv/bin/python manage.py" if Path(sys.prefix).resolve() == venv.resolve() else "python manage.py"


def environment_note(environ: Mapping[str, str] | None = None) -> str:
    """When the environment names another brain than the stored brain role (which is the
    authority after the first start): one paragraph naming both and the one command that
    drafts the change for the owner to confirm. Empty otherwise."""
    env = os.environ if environ is None else environ
    try:
        wanted = roles.environment_brain(env)
    except YimiError as exc:
        return f"model settings: the environment's brain is not usable ({exc.message}); the stored brain role is used"
    if wanted is None:
        return ""
    stored = roles.stored("brain")
    if stored is not None and (stored.base_url.rstrip("/"), stored.model) == (wanted["base_url"].rstrip("/"), wanted["model"]):
        return ""
    if stored is None:
        now = "there is no stored brain role"
    else:
        demo = ", the demo brain" if roles.demo_brain_port(stored.provider, stored.base_url) is not None else ""
        now = f"the stored brain role, which Yimi uses, is {stored.base_url} (model {stored.model}{demo})"
    command = [*manage_command().split(), "model_settings", "draft", "brain", "--base-url", wanted["base_url"], "--model", wanted["model"]]
    if env.get("YIMI_BRAIN_PROVIDER", "").strip():
        command += ["--provider", wanted["provider"]]
    key_file = Path(settings.SECRETS_DIR) / "brain_api_key"
    if read_secret(Path(settings.SECRETS_DIR), "brain_api_key"):
        command += ["--api-key-file", str(key_file)]
    elif env.get("YIMI_BRAIN_API_KEY", "").strip():
        command += ["--api-key-env", "YIMI_BRAIN_API_KEY"]
    return (
        f"model settings: the environment names the brain {wanted['base_url']} (model {wanted['model']}), but {now}. "
        "YIMI_BRAIN_* is read at the first start only; after it, a change is a draft you confirm on your phone or Mac. "
        f"To draft this one:\n  {shlex.join(command)}"
    )


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
