"""Disk admission for raw writes (L5, docs/memory.md "Raw store (L5)"): a write is admitted only when
the file system that will hold it keeps its reserve afterwards.

``admit_write(directory, size)``: free bytes ≥ ``DISK_RESERVE_BYTES`` (4 GiB) + ``size`` and
free inodes ≥ ``DISK_RESERVE_INODES`` (500,000), measured with ``os.statvfs`` on the
directory (or its nearest existing parent) right before the write; otherwise
``storage_full`` and nothing is written. The free space counted is what an unprivileged
process may use (``f_bavail``, ``f_favail``), not the root-only reserve.

``check(directory, size)`` measures the same and says more, for the raw store
(``memory.archive.raw_store``): ``refused`` and why (``bytes`` or ``inodes``), how much is
missing, and ``tight`` — admitted, but below the warning levels ``DISK_WARN_BYTES``
(default 6 GiB: the reserve plus 2 GiB) + ``size`` or ``DISK_WARN_INODES`` (default
600,000), when the owner is told before anything is refused.
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


@dataclass(frozen=True)
class Admission:
    free: DiskFree
    missing_bytes: int  # how many more free bytes the write needs (0 when enough)
    missing_inodes: int
    tight: bool  # admitted but below the warning levels

    @property
    def refused(self) -> bool:
        return self.missing_bytes > 0 or self.missing_inodes > 0

    @property
    def reason(self) -> str:
        """``bytes`` or ``inodes`` (bytes first when both are short); "" when admitted."""
        return "bytes" if self.missing_bytes > 0 else "inodes" if self.missing_inodes > 0 else ""


def check(directory: Path, size: int) -> Admission:
    """Measure the file system holding ``directory`` for one new file of ``size`` bytes."""
    free = disk_free(Path(directory))
    missing_bytes = max(0, settings.DISK_RESERVE_BYTES + size - free.bytes)
    missing_inodes = max(0, settings.DISK_RESERVE_INODES - free.inodes)
    tight = free.bytes < settings.DISK_WARN_BYTES + size or free.inodes < settings.DISK_WARN_INODES
    return Admission(free, missing_bytes, missing_inodes, tight)


def admit_write(directory: Path, size: int) -> None:
    """Raise ``storage_full`` unless writing ``size`` bytes (one new file) under ``directory``
    leaves the reserve of bytes and inodes free."""
    free = disk_free(Path(directory))
    if free.bytes < settings.DISK_RESERVE_BYTES + size or free.inodes < settings.DISK_RESERVE_INODES:
        raise YimiError(
            "storage_full",
            "the server's disk is too full to store this; nothing was stored",
        )
