"""Disk admission for raw writes (L5, DESIGN.md "Numbers"): a write is admitted only when
the file system that will hold it keeps its reserve afterwards.

``admit_write(directory, size)``: free bytes ≥ ``DISK_RESERVE_BYTES`` (4 GiB) + ``size`` and
free inodes ≥ ``DISK_RESERVE_INODES`` (500,000), measured with ``os.statvfs`` on the
directory (or its nearest existing parent) right before the write; otherwise
``storage_full`` and nothing is written. The free space counted is what an unprivileged
process may use (``f_bavail``, ``f_favail``), not the root-only reserve.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from yimi_project.errors import YimiError


@dataclass(frozen=True)
class DiskFree:
    bytes: int
    inodes: int


def measure(path: Path) -> DiskFree:
    """Free bytes and inodes of the file system holding ``path`` (or its nearest existing parent)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    stats = os.statvfs(probe)
    return DiskFree(bytes=stats.f_bavail * stats.f_frsize, inodes=stats.f_favail)


# Tests replace it to stand for a nearly full disk; production measures the real one.
disk_free: Callable[[Path], DiskFree] = measure


def admit_write(directory: Path, size: int) -> None:
    """Raise ``storage_full`` unless writing ``size`` bytes (one new file) under ``directory``
    leaves the reserve of bytes and inodes free."""
    free = disk_free(Path(directory))
    if free.bytes < settings.DISK_RESERVE_BYTES + size or free.inodes < settings.DISK_RESERVE_INODES:
        raise YimiError(
            "storage_full",
            "the server's disk is too full to store this; nothing was stored",
        )
