"""Secrets: read from files in the secrets directory, or generated into the data directory.

Nothing secret lives in the repository. Generated files are created with mode 0600
atomically (``O_EXCL``), so two processes starting at once agree on one value.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def read_secret(secrets_dir: Path, name: str) -> str:
    """Return the stripped content of ``secrets_dir/name``, or "" when it is absent."""
    try:
        return (secrets_dir / name).read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return ""


def read_secret_file(path: str | Path, what: str, *, consequence: str = "") -> str:
    """The stripped content of a file an operator named on the command line (``--api-key-file``,
    ``--owner-password-file``...); a ``CommandError`` naming ``what`` when it cannot be read or is
    empty, followed by ``consequence`` ("no draft was made")."""
    from django.core.management.base import CommandError

    tail = f"; {consequence}" if consequence else ""
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise CommandError(f"cannot read {what} {path}: {exc.strerror}{tail}") from None
    if not text:
        raise CommandError(f"{what} {path} is empty{tail}")
    return text


def write_private_file(path: Path, data: bytes) -> bool:
    """Create ``path`` with mode 0600 holding ``data``; False if it already exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return True


def load_or_create_secret_key(data_dir: Path) -> str:
    path = data_dir / "django_secret_key"
    write_private_file(path, secrets.token_urlsafe(50).encode())
    return path.read_text(encoding="utf-8").strip()


def load_or_create_internal_token(secrets_dir: Path, data_dir: Path) -> str:
    """The token that loopback-only internal endpoints (gateway, pack callbacks) require."""
    configured = read_secret(secrets_dir, "internal_token")
    if configured:
        return configured
    path = data_dir / "internal_token"
    write_private_file(path, secrets.token_urlsafe(32).encode())
    return path.read_text(encoding="utf-8").strip()
