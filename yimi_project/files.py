"""Durable file writes, shared by every app (yimi_project is the lowest layer).

A file that must survive a crash whole is written beside its final name under a unique
temporary name, flushed and fsynced, renamed over the old file (``os.replace`` is atomic
within a directory) and then the directory is fsynced, so the rename itself is on disk.
After a crash a reader sees the old content or the new, never half of one and never an
empty file. Packs (``packs/``) are separate programs and keep their own copies.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def fsync_dir(path: Path | str) -> None:
    """Make the names in directory ``path`` durable (new, renamed or removed entries)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path | str, data: bytes, *, mode: int | None = None, sync_dir: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    ``mode``: the file's exact permissions (e.g. 0o600 for secrets and backups, 0o444 for a
    read-only projection). The temporary file is created 0600 and only then given ``mode``,
    so a secret is never readable by others, not even for a moment. None gives what
    ``open(path, "w")`` gives (0666 less the umask).
    ``sync_dir``: False when the caller writes several files into one directory and
    fsyncs it once itself (``fsync_dir``) after the last one.
    The temporary file is removed when anything fails; the old file is then unchanged.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(path.parent)
