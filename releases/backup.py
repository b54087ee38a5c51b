"""The backup a switch takes first: the database, and the model-settings store with its
master key: the two are backed up together and restored together.

The model settings live in the database (``brain.ModelRole``, provider keys sealed under
the master key), so the database dump holds the store; the master key file
(``llm.keyring.master_key_path``) is copied beside it, 0600, so the two are restored
together (``manage.py model_settings`` has the passphrase-wrapped export for moving them
to another instance). One directory per backup under ``<data dir>/backups/``, 0700, with
``MANIFEST.json`` (each file's size and SHA-256).

- PostgreSQL: ``pg_dump --format=custom`` (restore with ``pg_restore``);
- SQLite: SQLite's online backup API into ``db.sqlite3``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.db import connection

from llm import keyring
from yimi_project.errors import YimiError
from yimi_project.secrets import write_private_file


def _pg_dump(target: Path) -> None:
    db = connection.settings_dict
    env = {**os.environ}
    if db.get("PASSWORD"):
        env["PGPASSWORD"] = str(db["PASSWORD"])
    argv = ["pg_dump", "--format=custom", "--file", str(target), "--dbname", str(db["NAME"])]
    if db.get("HOST"):
        argv += ["--host", str(db["HOST"])]
    if db.get("PORT"):
        argv += ["--port", str(db["PORT"])]
    if db.get("USER"):
        argv += ["--username", str(db["USER"])]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise YimiError("backup_failed", f"pg_dump failed: {done.stderr.strip()[:300]}")


def _sqlite_backup(target: Path) -> None:
    source = sqlite3.connect(str(connection.settings_dict["NAME"]))
    try:
        dest = sqlite3.connect(str(target))
        with dest:
            source.backup(dest)
        dest.close()
    finally:
        source.close()


def backup_now(dest: Path | None = None, *, now: datetime | None = None) -> Path:
    """Back up the database and the model-settings master key; returns the directory."""
    when = now or datetime.now(UTC)
    base = dest or Path(settings.DATA_DIR) / "backups"
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder = base / f"release-{when:%Y%m%dT%H%M%S%fZ}"
    folder.mkdir(mode=0o700)
    if connection.vendor == "postgresql":  # by nature: each database has its own way to copy itself whole
        _pg_dump(folder / "db.dump")
    elif connection.vendor == "sqlite":
        _sqlite_backup(folder / "db.sqlite3")
    else:
        raise YimiError("backup_failed", f"no backup for the {connection.vendor} database")
    key = keyring.master_key_path()
    if key.is_file():
        write_private_file(folder / keyring.MASTER_KEY_FILE, key.read_bytes())
    files = {
        p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(folder.iterdir())
    }
    body = {"at": when.isoformat(), "database": connection.vendor, "files": files, "master_key": key.is_file()}
    (folder / "MANIFEST.json").write_text(json.dumps(body, indent=1))
    return folder
