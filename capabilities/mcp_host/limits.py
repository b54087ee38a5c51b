"""What a pack host may use: processes, memory, CPU time and open files (docs/packs.md).

Every pack host runs under four limits, ``PackLimits``: the defaults in settings
(``YIMI_PACK_LIMITS``), or what its pack's manifest asks for in a ``limits`` block, each
value at most the ceiling in settings (``YIMI_PACK_LIMIT_CEILINGS``; more is a manifest
error, ``pack_limit_over_ceiling``). A pack with a ``limits`` block gets a host of its own.

How they are enforced, in two layers:

- **rlimits, always.** The host process sets them on itself before it loads any pack code
  (``apply``, called first by ``host.main``; inside the sandbox, so ``RLIMIT_NPROC``
  counts only the sandbox's own tasks, threads included): ``RLIMIT_NPROC`` = processes,
  ``RLIMIT_AS`` = memory + ``ADDRESS_SPACE_HEADROOM_MIB`` (address space a process
  reserves without using it: 8 MiB of stack per thread, the allocator's arenas, which
  ``MALLOC_ARENA_MAX=2`` keeps few), ``RLIMIT_CPU`` = CPU seconds (SIGXCPU, then SIGKILL
  ``CPU_GRACE_SECONDS`` later), ``RLIMIT_NOFILE`` = open files. Every process the host
  starts inherits them. The sandbox's ``/tmp`` (memory, a tmpfs) is as large as the memory
  limit. The kernel does not apply ``RLIMIT_NPROC`` to uid 0: when the platform runs as
  root, only the cgroup bounds processes (``pack_limits_unenforced`` is logged when there
  is none).
- **a cgroup, where one can be made** (``cgroups.py``; v1 or v2, writable below this
  process's own cgroup, ``YIMI_PACK_CGROUPS=auto``): ``memory.max`` = memory (resident
  memory, tmpfs and page cache; no swap) and ``pids.max`` = processes, for the host and
  everything it starts, together. A ``sh`` joins it and then runs the host
  (``HostGuard.wrap``); the same ``sh`` writes the host's exit status and CPU time to a
  status file when it ends. The ``sh`` gets SIGKILL when the platform process dies
  (``setpriv --pdeathsig``), and bubblewrap's ``--die-with-parent`` then ends the sandbox,
  as it did when bubblewrap was the platform's own child. The cgroups and status files of
  a platform process that died without stopping its hosts are removed by the next one that
  starts a host (``sweep_leftovers``: their names carry the process id).

When a pack reaches a limit, the platform finds out from its own evidence — the cgroup's
counters (an OOM kill, a refused fork), the host's exit status (SIGXCPU, or SIGKILL after
its CPU time ran out) — or from the host, which reports a handler that failed for lack of
one (``limit_hit``: MemoryError, EMFILE, a refused fork or thread at the process limit);
a report only makes the host's own call fail and its host restart, which a pack can do
anyway. The manager then stops the host (the next call starts a fresh one) and the call
ends with the limit's code (``CODES``) as its transport error: ``unknown`` (the pack may
have acted before it was stopped), with the code in the receipt's ``error``.

This module is imported inside the sandbox too (by the host), so it needs no Django
settings at import; the platform-side helpers read them when called.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import resource
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp import StdioServerParameters

    from capabilities.manifest import Pack
    from capabilities.mcp_host.cgroups import Cgroup

MiB = 1024 * 1024
NAMES = ("processes", "memory_mib", "cpu_seconds", "open_files")
CODES = {
    "processes": "pack_limit_processes",
    "memory_mib": "pack_limit_memory",
    "cpu_seconds": "pack_limit_cpu",
    "open_files": "pack_limit_open_files",
}
OVER_CEILING = "pack_limit_over_ceiling"
PACK_UNAVAILABLE = "pack_unavailable"
# What a host adds to a call's result ``_meta``: the limit a failed handler ran into, and
# the host process's CPU time so far (the manager replaces a host that used half of its).
META_LIMIT = "ai.yimi/limit"
META_CPU = "ai.yimi/cpu_seconds"
ADDRESS_SPACE_HEADROOM_MIB = 512
CPU_GRACE_SECONDS = 2
RETIRE_AT = 0.5


@dataclass(frozen=True)
class PackLimits:
    processes: int
    memory_mib: int
    cpu_seconds: int
    open_files: int

    def as_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> PackLimits:
        data = json.loads(text)
        return cls(**{name: int(data[name]) for name in NAMES})

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PackLimits:
        return cls(**{name: int(data[name]) for name in NAMES})

    def overridden(self, declared: Mapping[str, Any]) -> PackLimits:
        return PackLimits(**{name: int(declared.get(name, getattr(self, name))) for name in NAMES})

    def describe(self, name: str) -> str:
        """What reaching limit ``name`` means, in words."""
        return {
            "processes": f"it started more processes (threads included) than its limit of {self.processes}",
            "memory_mib": f"it used more than its {self.memory_mib} MiB of memory",
            "cpu_seconds": f"it used its {self.cpu_seconds} seconds of CPU time",
            "open_files": f"it opened more files than its limit of {self.open_files}",
        }[name]


# --- the platform's side: which limits ----------------------------------------------------------


def defaults() -> PackLimits:
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    limits = PackLimits.from_mapping(settings.YIMI_PACK_LIMITS)
    above = over_ceiling(asdict(limits), ceilings())
    if above:
        raise ImproperlyConfigured("YIMI_PACK_LIMITS: " + "; ".join(above))
    return limits


def ceilings() -> PackLimits:
    from django.conf import settings

    return PackLimits.from_mapping(settings.YIMI_PACK_LIMIT_CEILINGS)


def over_ceiling(declared: Mapping[str, Any], ceiling: PackLimits) -> list[str]:
    """The values of a manifest's ``limits`` block above the platform's ceilings."""
    return [
        f"limits.{name} is {declared[name]}, above the platform's ceiling of {getattr(ceiling, name)}"
        for name in NAMES
        if isinstance(declared.get(name), int) and declared[name] > getattr(ceiling, name)
    ]


def for_packs(packs: Iterable[Pack]) -> PackLimits:
    """A host's limits: the defaults, with what its pack declared (a pack that declares
    limits has a host of its own)."""
    limits = defaults()
    for pack in packs:
        limits = limits.overridden(pack.limits)
    return limits


def host_arguments(limits: PackLimits) -> list[str]:
    """The host's command-line arguments that make it set ``limits`` on itself first."""
    from django.conf import settings

    # Outside a user namespace of its own, RLIMIT_NPROC would count the platform's processes.
    unshared = ["--no-process-rlimit"] if settings.YIMI_PACK_SANDBOX == "none" else []
    return ["--limits", limits.as_json(), *unshared]


# --- inside the host: setting them, and telling which one a failure ran into --------------------


def _lower(which: int, value: int, hard: int | None = None) -> None:
    """Set a limit no higher than it already is (an unprivileged process cannot raise it)."""
    _, current_hard = resource.getrlimit(which)
    wanted_hard = value if hard is None else hard
    if current_hard != resource.RLIM_INFINITY:
        wanted_hard = min(wanted_hard, current_hard)
    resource.setrlimit(which, (min(value, wanted_hard), wanted_hard))


def apply(limits: PackLimits, *, processes: bool = True) -> None:
    """Set this process's rlimits (the host calls this before it loads any pack code).
    ``processes`` is False where the host shares the platform's user namespace
    (``YIMI_PACK_SANDBOX=none``): there ``RLIMIT_NPROC`` would count the platform's own
    processes."""
    _lower(resource.RLIMIT_NOFILE, limits.open_files)
    _lower(resource.RLIMIT_AS, (limits.memory_mib + ADDRESS_SPACE_HEADROOM_MIB) * MiB)
    _lower(resource.RLIMIT_CPU, limits.cpu_seconds, limits.cpu_seconds + CPU_GRACE_SECONDS)
    if processes:
        _lower(resource.RLIMIT_NPROC, limits.processes)


def tasks_in_sandbox() -> int:
    """Tasks (threads included) in this sandbox's PID namespace: its own ``/proc``."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/status", "rb") as fh:
                    for line in fh:
                        if line.startswith(b"Threads:"):
                            count += int(line.split()[1])
                            break
            except (OSError, ValueError):
                continue
    return count


def limit_hit(exc: BaseException, limits: PackLimits, *, count_tasks: bool = True) -> str | None:
    """The limit a handler's exception shows it ran into, or None. A refused fork (EAGAIN)
    or thread counts as the process limit only while the sandbox holds about that many
    tasks (EAGAIN has other causes); a thread refused below it ran out of address space."""
    if isinstance(exc, MemoryError):
        return "memory_mib"
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return "open_files"
    refused_fork = isinstance(exc, OSError) and exc.errno == errno.EAGAIN
    refused_thread = isinstance(exc, RuntimeError) and "can't start new thread" in str(exc)
    if refused_fork or refused_thread:
        if count_tasks and tasks_in_sandbox() >= limits.processes - 2:
            return "processes"
        return "memory_mib" if refused_thread else None
    return None


# --- the platform's side: the cgroup, the wrapper, the evidence ----------------------------------

# sh joins each cgroup named after the status file and before "--" (its own pid: every process
# it starts is in them too), runs the host, then writes the host's exit status and the CPU
# time of everything it ran (``times``, second line) to the status file. A join that fails
# exits 125 before the host ran.
JOIN_FAILED = "yimi: cannot join the pack host's cgroup"
WRAPPER = (
    'status=$1; shift; while [ "$1" != "--" ]; do echo $$ > "$1" || { echo "' + JOIN_FAILED + ' $1" >&2; exit 125; }; shift; done; shift; '
    '"$@"; code=$?; { echo "$code"; times; } > "$status"; exit $code'
)
_DURATION = re.compile(r"(\d+)m([\d.]+)s")
_unenforced_logged: set[str] = set()
CGROUP_PREFIX = "yimi-pack-"  # + key, the platform process's id, random
STATUS_PREFIX = "yimi-pack-host-"  # + the platform process's id, random, ".status"
_swept = False


def _gone(pid_text: str) -> bool:
    """Whether the process with this id (from a leftover's name) no longer exists."""
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except (ValueError, OSError):
        return False  # not a pid, or another user's: not ours to judge
    return False


def sweep_leftovers(*, force: bool = False) -> list[str]:
    """Remove the empty cgroups and the status files that pack hosts of platform processes
    that no longer exist left behind (a process that died without stopping its hosts); once
    per process unless ``force``. A cgroup that still holds a process is left alone (rmdir
    refuses it). Returns the names removed."""
    global _swept
    if _swept and not force:
        return []
    _swept = True
    from capabilities.mcp_host.cgroups import children

    removed = []
    for directory in children(CGROUP_PREFIX):
        parts = directory.name.rsplit("-", 2)
        if len(parts) == 3 and _gone(parts[1]):
            try:
                directory.rmdir()
                removed.append(directory.name)
            except OSError:
                pass
    for status in Path(tempfile.gettempdir()).glob(f"{STATUS_PREFIX}*.status"):
        if _gone(status.name[len(STATUS_PREFIX):].split("-", 1)[0]):
            with contextlib.suppress(OSError):
                status.unlink()
                removed.append(status.name)
    return removed


@dataclass
class HostGuard:
    """One host process's limits as the platform holds them: its cgroup (if any) and the
    status file its wrapper writes."""

    key: str
    limits: PackLimits
    status_path: Path
    cgroup: Cgroup | None = None
    released: bool = False

    @classmethod
    def make(cls, key: str, limits: PackLimits, *, cgroups: str) -> HostGuard:
        """A status file and, unless ``cgroups`` is ``"off"``, a cgroup with the limits (none
        when this machine has no writable one: the rlimits remain)."""
        from capabilities.mcp_host.cgroups import CgroupLimits, CgroupUnavailable, create_cgroup
        from yimi_project.logs import log_event

        sweep_leftovers()
        fd, name = tempfile.mkstemp(prefix=f"{STATUS_PREFIX}{os.getpid()}-", suffix=".status")
        os.close(fd)
        guard = cls(key, limits, Path(name))
        if cgroups != "off":
            safe = re.sub(r"[^a-z0-9_-]", "-", key.lower())[:32]
            try:
                guard.cgroup = create_cgroup(
                    f"{CGROUP_PREFIX}{safe}-{os.getpid()}-{uuid.uuid4().hex[:12]}", CgroupLimits(memory_bytes=limits.memory_mib * MiB, pids=limits.processes)
                )
            except CgroupUnavailable as exc:
                if "cgroup" not in _unenforced_logged:
                    _unenforced_logged.add("cgroup")
                    log_event("pack_limits_without_cgroup", reason=str(exc)[:200])
        if guard.cgroup is None and os.geteuid() == 0 and "processes" not in _unenforced_logged:
            _unenforced_logged.add("processes")
            log_event("pack_limits_unenforced", limit="processes", reason="no writable cgroup, and RLIMIT_NPROC does not bind uid 0")
        return guard

    def wrap(self, params: StdioServerParameters) -> StdioServerParameters:
        """The host's command, run by the wrapper ``sh`` inside the cgroup."""
        from mcp import StdioServerParameters

        joins = [str(p) for p in self.cgroup.procs_files] if self.cgroup is not None else []
        env = dict(params.env or {})
        env["MALLOC_ARENA_MAX"] = "2"  # few allocator arenas: address space the memory limit need not cover
        wrapper = ["/bin/sh", "-c", WRAPPER, "sh", str(self.status_path), *joins, "--", params.command, *params.args]
        setpriv = shutil.which("setpriv")  # util-linux
        if setpriv is not None:
            wrapper = [setpriv, "--pdeathsig", "KILL", "--", *wrapper]  # the sh dies with the platform, the sandbox with it
        return StdioServerParameters(command=wrapper[0], args=wrapper[1:], env=env, cwd=params.cwd)

    def exit_status(self) -> tuple[int | None, float | None]:
        """The host's exit status (128 + n: killed by signal n) and the CPU seconds it and
        its children used, once its wrapper wrote them; (None, None) before, or when the
        wrapper itself was stopped."""
        try:
            lines = self.status_path.read_text().splitlines()
            code = int(lines[0])
        except (OSError, ValueError, IndexError):
            return None, None
        cpu = None
        if len(lines) >= 3:
            parts = _DURATION.findall(lines[2])
            if len(parts) == 2:
                cpu = sum(int(m) * 60 + float(s) for m, s in parts)
        return code, cpu

    def evidence(self) -> str | None:
        """A limit the cgroup's counters show was reached, now."""
        if self.cgroup is None:
            return None
        if self.cgroup.oom_killed():
            return "memory_mib"
        if self.cgroup.pids_limited():
            return "processes"
        return None

    def diagnose(self, reported: str | None) -> str | None:
        """Which limit ended (or hurt) this host. One that died (a non-zero exit status): the
        platform's evidence first (the cgroup's counters, the exit status), then what it had
        reported. One the platform stopped (it was still running): what it reported, which
        its handler ran into; else the cgroup's counters (a child killed or refused)."""
        code, cpu = self.exit_status()
        if code in (None, 0) and reported in NAMES:
            return reported
        if self.cgroup is not None and self.cgroup.oom_killed():
            return "memory_mib"
        if code == 128 + signal.SIGXCPU:
            return "cpu_seconds"
        if code == 128 + signal.SIGKILL and cpu is not None and cpu >= self.limits.cpu_seconds:
            return "cpu_seconds"  # it caught SIGXCPU and ran on until the hard limit
        if self.cgroup is not None and self.cgroup.pids_limited():
            return "processes"
        return reported if reported in NAMES else None

    def release(self) -> None:
        """Remove the cgroup (killing anything left in it) and the status file."""
        if self.released:
            return
        self.released = True
        if self.cgroup is not None:
            self.cgroup.remove()
        try:
            self.status_path.unlink()
        except OSError:
            pass

