"""``manage.py model_settings export FILE | import FILE | rotate-key``.

- ``export FILE``: the model roles with their provider keys still sealed, plus the master
  key wrapped under a passphrase (``--passphrase-file`` or asked twice). FILE is created
  0600 and never overwritten.
- ``import FILE``: restores such a backup (``brain.role_backup.import_settings``); a
  backup without the wrapped key or a wrong passphrase is refused and nothing changes.
- ``rotate-key``: a new master key; every provider key re-wrapped in one transaction,
  then the key file replaced.

Every error is one line (``CommandError``), never a traceback, and no command prints a
key.
"""

from __future__ import annotations

import getpass
import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from brain import role_backup
from yimi_project.errors import YimiError
from yimi_project.secrets import write_private_file


class Command(BaseCommand):
    help = "Export, import (with the wrapped master key) or rotate the master key of the model settings."

    def add_arguments(self, parser: Any) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        for name, text in (("export", "write a backup to FILE (created, never overwritten)"), ("import", "restore the backup in FILE")):
            action = sub.add_parser(name, help=text)
            action.add_argument("file")
            action.add_argument("--passphrase-file", help="read the backup passphrase from this file (else it is asked)")
        sub.add_parser("rotate-key", help="generate a new master key and re-wrap every provider key")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            if opts["action"] == "export":
                self._export(Path(opts["file"]), self._passphrase(opts, confirm=True))
            elif opts["action"] == "import":
                self._import(Path(opts["file"]), self._passphrase(opts, confirm=False))
            else:
                key_id = role_backup.rotate_master_key()
                self.stdout.write(f"model master key rotated (new key id {key_id}); every provider key was re-wrapped")
        except YimiError as exc:
            raise CommandError(f"{exc.message} ({exc.code})") from None

    def _passphrase(self, opts: dict[str, Any], *, confirm: bool) -> str:
        if opts.get("passphrase_file"):
            try:
                return Path(opts["passphrase_file"]).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise CommandError(f"cannot read the passphrase file: {exc.strerror}") from None
        try:
            first = getpass.getpass("backup passphrase: ")
            if confirm and getpass.getpass("again: ") != first:
                raise CommandError("the two passphrases differ; nothing was written")
        except (EOFError, KeyboardInterrupt):
            raise CommandError("no passphrase given (use --passphrase-file when there is no terminal)") from None
        return first

    def _export(self, path: Path, passphrase: str) -> None:
        document = role_backup.export_settings(passphrase)
        data = (json.dumps(document, ensure_ascii=False, indent=2) + "\n").encode()
        try:
            created = write_private_file(path, data)
        except OSError as exc:
            raise CommandError(f"cannot write {path}: {exc.strerror}") from None
        if not created:
            raise CommandError(f"{path} exists; choose a new file name (a backup is never overwritten)")
        self.stdout.write(f"exported {len(document['roles'])} model roles with the wrapped master key to {path}")

    def _import(self, path: Path, passphrase: str) -> None:
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        except ValueError:
            raise CommandError(f"{path} is not a model settings backup (not JSON); nothing was changed") from None
        if not isinstance(document, dict):
            raise CommandError(f"{path} is not a model settings backup; nothing was changed")
        try:
            restored = role_backup.import_settings(document, passphrase)
        except YimiError as exc:
            raise CommandError(f"{exc.message}; nothing was changed ({exc.code})") from None
        self.stdout.write(f"restored model roles: {', '.join(restored) or 'none'} (their keys sealed under this instance's master key)")
