"""Per-process-tree cgroups for sandboxed programs: pack hosts and the workshop's builds.

A cgroup is made below this process's own cgroup, one directory per v1 controller when
the controllers it needs are mounted as cgroup v1 (``memory.limit_in_bytes``, and
``memory.memsw.limit_in_bytes`` where swap is accounted; ``pids.max``;
``cpu.cfs_quota_us``/``cpu.cfs_period_us`` when a CPU quota is asked for), else one
cgroup v2 directory (``memory.max``, ``memory.swap.max`` 0, ``pids.max``, ``cpu.max``).
A program joins it before it starts (a ``sh`` that writes its own pid to each
``cgroup.procs`` and then runs the program), so nothing it starts is ever outside it.

``create_cgroup`` raises ``CgroupUnavailable`` when no such hierarchy is writable here or
the kernel refuses a limit (having removed what it made); what a caller does then is its
own policy (the workshop refuses to run, a pack host falls back to its rlimits). The
cgroup's counters say what a limit did: ``oom_killed`` (the memory limit killed
something), ``pids_limited`` (a fork was refused), ``cpu_throttled``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from yimi_project.logs import log_event

CGROUP_ROOT = Path("/sys/fs/cgroup")


class CgroupUnavailable(Exception):
    pass


@dataclass(frozen=True)
class CgroupLimits:
    memory_bytes: int
    pids: int
    cpu_quota_us: int | None = None  # None: no CPU quota, and the cpu controller is not needed
    cpu_period_us: int = 100_000

    @property
    def controllers(self) -> tuple[str, ...]:
        return ("memory", "cpu", "pids") if self.cpu_quota_us is not None else ("memory", "pids")


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and ``""`` → its v2 path."""
    paths: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(fstype, mountpoint, options) of every cgroup mount."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            found.append((parts[2], parts[1], set(parts[3].split(","))))
    return found


@dataclass
class Cgroup:
    """One cgroup (one directory per v1 controller, or one v2 directory)."""

    version: str
    dirs: dict[str, Path] = field(default_factory=dict)  # controller ("" for v2) → directory

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in dict.fromkeys(self.dirs.values())]

    def _read(self, controller: str, name: str) -> str:
        try:
            return (self.dirs[controller] / name).read_text()
        except (OSError, KeyError):
            return ""

    @staticmethod
    def _counter(text: str, key: str) -> int:
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
                return int(parts[1])
        return 0

    def oom_killed(self) -> bool:
        if self.version == "v1":
            return self._counter(self._read("memory", "memory.oom_control"), "oom_kill") > 0
        return self._counter(self._read("", "memory.events"), "oom_kill") > 0

    def pids_limited(self) -> bool:
        controller = "pids" if self.version == "v1" else ""
        return self._counter(self._read(controller, "pids.events"), "max") > 0

    def cpu_throttled(self) -> int:
        return self._counter(self._read("cpu" if self.version == "v1" else "", "cpu.stat"), "nr_throttled")

    def remove(self) -> None:
        """Kill whatever is left in the cgroup, then remove its directories."""
        for directory in dict.fromkeys(self.dirs.values()):
            for _ in range(50):
                try:
                    pids = [int(p) for p in (directory / "cgroup.procs").read_text().split()]
                except OSError:
                    pids = []
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)  # the killed processes are still being reaped
            else:
                log_event("cgroup_left", cgroup=directory.name)


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupUnavailable(f"cannot set {path.name} to {value} ({exc.strerror or exc})") from None


def children(prefix: str, controllers: tuple[str, ...] = ("memory", "pids", "cpu"), root: Path = CGROUP_ROOT) -> list[Path]:
    """The cgroups named ``prefix…`` where ``create_cgroup`` makes them (below this
    process's own cgroup, per v1 controller and in v2)."""
    own = _own_paths()
    parents = set()
    for fstype, point, options in _mounts():
        if not Path(point).is_relative_to(root):
            continue
        if fstype == "cgroup":
            parents |= {Path(point) / own[c].lstrip("/") for c in controllers if c in options and c in own}
        elif "" in own:
            parents.add(Path(point) / own[""].lstrip("/"))
    found = []
    for parent in sorted(parents):
        try:
            found += [d for d in parent.iterdir() if d.name.startswith(prefix) and d.is_dir()]
        except OSError:
            continue
    return found


@contextmanager
def _removed_on_failure(group: Cgroup) -> Iterator[None]:
    """What of ``group`` was made is removed if making the rest fails (``CgroupUnavailable``)."""
    try:
        yield
    except OSError as exc:
        group.remove()
        raise CgroupUnavailable(f"cannot create the cgroup ({exc.strerror or exc})") from None
    except CgroupUnavailable:
        group.remove()
        raise


def create_cgroup(name: str, limits: CgroupLimits, root: Path = CGROUP_ROOT) -> Cgroup:
    """Make the cgroup ``name`` below this process's own and set every limit, or raise
    ``CgroupUnavailable`` (having removed what was made)."""
    wanted = limits.controllers
    own = _own_paths()
    mounts = _mounts()
    v1 = {}
    for controller in wanted:
        for fstype, point, options in mounts:
            if fstype == "cgroup" and controller in options and Path(point).is_relative_to(root) and controller in own:
                v1[controller] = Path(point) / own[controller].lstrip("/") / name
                break
    if len(v1) == len(wanted):
        group = Cgroup("v1")
        with _removed_on_failure(group):
            for controller, directory in v1.items():
                directory.mkdir()
                group.dirs[controller] = directory
            memory = group.dirs["memory"]
            _write(memory / "memory.limit_in_bytes", str(limits.memory_bytes))
            if (memory / "memory.memsw.limit_in_bytes").exists():
                _write(memory / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
            if limits.cpu_quota_us is not None:
                _write(group.dirs["cpu"] / "cpu.cfs_period_us", str(limits.cpu_period_us))
                _write(group.dirs["cpu"] / "cpu.cfs_quota_us", str(limits.cpu_quota_us))
            _write(group.dirs["pids"] / "pids.max", str(limits.pids))
        return group
    for fstype, point, _ in mounts:
        if fstype != "cgroup2" or "" not in own:
            continue
        parent = Path(point) / own[""].lstrip("/")
        try:
            available = set((parent / "cgroup.controllers").read_text().split())
            enabled = set((parent / "cgroup.subtree_control").read_text().split())
        except OSError:
            continue
        if not set(wanted) <= available:
            continue
        if not set(wanted) <= enabled:
            _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
        group = Cgroup("v2")
        with _removed_on_failure(group):
            (parent / name).mkdir()
            group.dirs[""] = parent / name
            _write(parent / name / "memory.max", str(limits.memory_bytes))
            if (parent / name / "memory.swap.max").exists():
                _write(parent / name / "memory.swap.max", "0")
            if limits.cpu_quota_us is not None:
                _write(parent / name / "cpu.max", f"{limits.cpu_quota_us} {limits.cpu_period_us}")
            _write(parent / name / "pids.max", str(limits.pids))
        return group
    raise CgroupUnavailable(f"no cgroup hierarchy with the {', '.join(wanted)} controllers is writable here")
