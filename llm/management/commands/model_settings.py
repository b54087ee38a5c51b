"""``manage.py model_settings export FILE | import FILE | rotate-key | draft ROLE ...``.

- ``export FILE``: the model roles with their provider keys still sealed, plus the master
  key wrapped under a passphrase (``--passphrase-file`` or asked twice). FILE is created
  0600 and never overwritten.
- ``import FILE``: restores such a backup (``llm.role_backup.import_settings``); a
  backup without the wrapped key or a wrong passphrase is refused and nothing changes.
- ``rotate-key``: a new master key; every provider key re-wrapped in one transaction,
  then the key file replaced.
- ``draft ROLE --base-url URL --model NAME [--provider NAME] [--api-key-file FILE |
  --api-key-env VARIABLE]``: a draft of a change to ROLE (``llm.role_drafts.create_draft``,
  made by the owner at the console), its endpoint probed once; the role's other options stay.
  Nothing changes until the owner confirms it on a device, as any draft.

Every error is one line (``CommandError``), never a traceback, and no command prints a
key.
"""

from __future__ import annotations

import getpass
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.core.management.base import BaseCommand, CommandError

from llm import role_backup, role_drafts, roles
from llm.models import ModelRoleDraft
from yimi_project.errors import YimiError
from yimi_project.secrets import read_secret_file, write_private_file


class Command(BaseCommand):
    help = "Export, import (with the wrapped master key) or rotate the master key of the model settings."

    def add_arguments(self, parser: Any) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        for name, text in (("export", "write a backup to FILE (created, never overwritten)"), ("import", "restore the backup in FILE")):
            action = sub.add_parser(name, help=text)
            action.add_argument("file")
            action.add_argument("--passphrase-file", help="read the backup passphrase from this file (else it is asked)")
        sub.add_parser("rotate-key", help="generate a new master key and re-wrap every provider key")
        draft = sub.add_parser("draft", help="draft a change of a model role, to confirm on your phone or Mac")
        draft.add_argument("role", help="the model role, e.g. brain")
        draft.add_argument("--base-url", required=True, help="the OpenAI-compatible /v1 root, e.g. http://127.0.0.1:11434/v1")
        draft.add_argument("--model", required=True, help="the model name sent to the endpoint")
        draft.add_argument("--provider", help="the provider name shown in the console (default: the URL's host)")
        key = draft.add_mutually_exclusive_group()
        key.add_argument("--api-key-file", help="read a new provider key from this file (else the stored key stays)")
        key.add_argument("--api-key-env", metavar="VARIABLE", help="read a new provider key from this environment variable")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            if opts["action"] == "export":
                self._export(Path(opts["file"]), self._passphrase(opts, confirm=True))
            elif opts["action"] == "import":
                self._import(Path(opts["file"]), self._passphrase(opts, confirm=False))
            elif opts["action"] == "draft":
                self._draft(opts)
            else:
                key_id = role_backup.rotate_master_key()
                self.stdout.write(f"model master key rotated (new key id {key_id}); every provider key was re-wrapped")
        except YimiError as exc:
            raise CommandError(f"{exc.message} ({exc.code})") from None

    def _draft(self, opts: dict[str, Any]) -> None:
        api_key = None
        if opts["api_key_file"]:
            api_key = read_secret_file(opts["api_key_file"], "the API key file", consequence="no draft was made")
        elif opts["api_key_env"]:
            api_key = os.environ.get(opts["api_key_env"], "").strip()
            if not api_key:
                raise CommandError(f"{opts['api_key_env']} is not set; no draft was made")
        base_url = opts["base_url"].strip()
        provider = (opts["provider"] or "").strip() or urlsplit(base_url).hostname or ""
        role = opts["role"]
        options = role_drafts.current_settings(role)["options"] if role in roles.ROLES else None
        draft, _ = role_drafts.create_draft(
            role, provider=provider, base_url=base_url, model=opts["model"], options=options, api_key=api_key,
            created_by=ModelRoleDraft.Creator.OWNER_CONSOLE, note="drafted with manage.py model_settings draft",
        )
        draft = role_drafts.probe_draft(draft.id)
        self.stdout.write(f"draft {draft.id} made: {draft.role} → {draft.base_url} (model {draft.model}, provider {draft.provider}, key {draft.key_change})")
        if draft.probe_status == ModelRoleDraft.Probe.OK:
            self.stdout.write(f"probe: ok, the endpoint answered a chat completion in {draft.probe_latency_ms} ms")
        else:
            self.stdout.write(f"probe: {draft.probe_status} ({draft.probe_error_code or '-'}: {draft.probe_message}); you can still confirm it")
        self.stdout.write(
            "Nothing changes until you confirm it on your phone or Mac (the Model drafts page, /admin/llm/modelroledraft/, "
            f"shows it); with the simulator: .venv/bin/python manage.py device_sim confirm-draft {draft.id} --key-file var/phone.json. "
            "It takes effect from the next run."
        )

    def _passphrase(self, opts: dict[str, Any], *, confirm: bool) -> str:
        if opts.get("passphrase_file"):
            return read_secret_file(opts["passphrase_file"], "the passphrase file")
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
