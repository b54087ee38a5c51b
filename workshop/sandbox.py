"""The workshop sandbox: bubblewrap for isolation, a cgroup of its own for the limits.

Every program the workshop runs on a pack it built (the pack's self-test) runs here, never
unlimited:

- **isolation** is the pack sandbox's (``capabilities.mcp_host.sandbox.host_parameters``,
  the same ``bwrap`` command line packs run under: fresh user/PID/IPC/UTS/cgroup/network
  namespaces, uid 65534, the system and Python directories read-only, its own ``/tmp``),
  granted nothing (no secrets, no writable directory, no platform socket, no egress) and
  with the root itself remounted read-only (``--remount-ro /``). The data directory and
  the secrets directory are not bound, so conversation and memory data are invisible; only
  the build's own directory is bound, read-only. The own network namespace has only a
  loopback of its own: nothing (not the host's 127.0.0.1) is reachable.
- **limits** (DESIGN.md "workshop sandbox"): 256 MiB of memory, 0.5 CPU, at most 128
  processes, through a per-run cgroup made below this process's own cgroup. cgroup v1
  (``memory.limit_in_bytes`` and ``memory.memsw.limit_in_bytes`` when swap is accounted,
  ``cpu.cfs_quota_us``/``cpu.cfs_period_us``, ``pids.max``) when the memory, cpu and pids
  controllers are mounted as v1; else cgroup v2 (``memory.max``, ``memory.swap.max``,
  ``cpu.max``, ``pids.max``). The sandbox process joins the cgroups before it starts
  bubblewrap (a ``sh`` that writes its own pid to each ``cgroup.procs`` and then execs
  ``bwrap``), so nothing it runs is ever outside them. If a limit cannot be set or joined
  the run fails with ``sandbox_unavailable`` and nothing runs: there is no unlimited
  fallback. The cgroup is removed afterwards (any process left in it is killed first).

``run_sandboxed`` returns what happened: exit status, the tails of stdout and stderr, and
whether the memory limit killed something (``oom_killed``), the process limit refused a
fork (``pids_limited``) or the CPU quota held it back (``cpu_throttled`` periods), read from
the cgroup's own counters.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from capabilities.mcp_host.sandbox import PackGrant, SandboxUnavailable, host_parameters
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

MiB = 1024 * 1024
CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "cpu", "pids")
TAIL_BYTES = 4000
# sh joins each cgroup named before "--" (its own pid: the pid bwrap will have after exec),
# then execs the rest. A join that fails exits 125 before anything of the build ran.
# It also caps the size of any file the sandbox writes (``ulimit -f``, 512-byte blocks: 8 MiB),
# so its stdout and stderr, which are files on the host, cannot fill the host's disk.
JOIN_FAILED = "yimi-workshop: cannot join the cgroup"
OUTPUT_BLOCKS = 16384
JOIN_SCRIPT = (
    f"ulimit -f {OUTPUT_BLOCKS} || exit 125; "
    'while [ "$1" != "--" ]; do echo $$ > "$1" || { echo "' + JOIN_FAILED + ' $1" >&2; exit 125; }; shift; done; shift; exec "$@"'
)


@dataclass(frozen=True)
class SandboxLimits:
    memory_bytes: int = 256 * MiB
    cpu_quota_us: int = 50_000
    cpu_period_us: int = 100_000
    pids: int = 128


WORKSHOP_LIMITS = SandboxLimits()


@dataclass
class SandboxResult:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    oom_killed: bool = False
    pids_limited: bool = False
    cpu_throttled: int = 0  # periods in which the CPU quota stopped it (cpu.stat nr_throttled)
    cgroup_version: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.oom_killed

    def describe(self) -> str:
        """One line saying how the run ended."""
        if self.oom_killed:
            return f"killed: the memory limit was reached (exit {self.returncode})"
        if self.timed_out:
            return "stopped: no result within the time limit"
        extra = "; the process limit refused a fork" if self.pids_limited else ""
        return f"exit {self.returncode}{extra}"


def unavailable(message: str) -> YimiError:
    return YimiError("sandbox_unavailable", message)


# --- cgroups -------------------------------------------------------------------------------------


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
    """One run's cgroup (one directory per v1 controller, or one v2 directory)."""

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
                log_event("workshop_cgroup_left", cgroup=directory.name)


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise unavailable(f"cannot set {path.name} to {value} ({exc.strerror or exc})") from None


def create_cgroup(name: str, limits: SandboxLimits, root: Path = CGROUP_ROOT) -> Cgroup:
    """Make the run's cgroup below this process's own and set every limit, or raise
    ``sandbox_unavailable`` (having removed what was made)."""
    own = _own_paths()
    mounts = _mounts()
    v1 = {}
    for controller in CONTROLLERS:
        for fstype, point, options in mounts:
            if fstype == "cgroup" and controller in options and Path(point).is_relative_to(root) and controller in own:
                v1[controller] = Path(point) / own[controller].lstrip("/") / name
                break
    if len(v1) == len(CONTROLLERS):
        group = Cgroup("v1")
        try:
            for controller, directory in v1.items():
                directory.mkdir()
                group.dirs[controller] = directory
            memory = group.dirs["memory"]
            _write(memory / "memory.limit_in_bytes", str(limits.memory_bytes))
            if (memory / "memory.memsw.limit_in_bytes").exists():
                _write(memory / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
            _write(group.dirs["cpu"] / "cpu.cfs_period_us", str(limits.cpu_period_us))
            _write(group.dirs["cpu"] / "cpu.cfs_quota_us", str(limits.cpu_quota_us))
            _write(group.dirs["pids"] / "pids.max", str(limits.pids))
        except OSError as exc:
            group.remove()
            raise unavailable(f"cannot create the build's cgroup ({exc.strerror or exc})") from None
        except YimiError:
            group.remove()
            raise
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
        if not set(CONTROLLERS) <= available:
            continue
        if not set(CONTROLLERS) <= enabled:
            _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
        group = Cgroup("v2")
        try:
            (parent / name).mkdir()
            group.dirs[""] = parent / name
            _write(parent / name / "memory.max", str(limits.memory_bytes))
            if (parent / name / "memory.swap.max").exists():
                _write(parent / name / "memory.swap.max", "0")
            _write(parent / name / "cpu.max", f"{limits.cpu_quota_us} {limits.cpu_period_us}")
            _write(parent / name / "pids.max", str(limits.pids))
        except OSError as exc:
            group.remove()
            raise unavailable(f"cannot create the build's cgroup ({exc.strerror or exc})") from None
        except YimiError:
            group.remove()
            raise
        return group
    raise unavailable(
        "no cgroup hierarchy with the memory, cpu and pids controllers is writable here, so the "
        "workshop's limits (256 MiB, 0.5 CPU, 128 processes) cannot be enforced; builds do not run without them"
    )


# --- running -------------------------------------------------------------------------------------


def sandbox_command(args: list[str], *, readable: list[Path]) -> tuple[list[str], dict[str, str]]:
    """The ``bwrap`` command running ``python <args>`` as packs run, granted nothing,
    with a read-only root, and its environment."""
    try:
        params = host_parameters(args, PackGrant(), readable=readable, mode="bwrap")
    except SandboxUnavailable as exc:
        raise unavailable(str(exc)) from None
    argv = list(params.args)
    at = argv.index("--chdir")
    argv[at:at] = ["--remount-ro", "/"]
    return [params.command, *argv], dict(params.env or {})


def _tail(path: Path) -> str:
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - TAIL_BYTES))
        return fh.read().decode("utf-8", "replace")


def run_sandboxed(
    args: list[str],
    *,
    readable: list[Path],
    timeout: float,
    limits: SandboxLimits = WORKSHOP_LIMITS,
    cgroup_root: Path = CGROUP_ROOT,
) -> SandboxResult:
    """Run ``python <args>`` in the workshop sandbox under ``limits``; ``timeout`` bounds
    the wait (the whole sandbox is killed then). Raises ``sandbox_unavailable`` when the
    isolation or a limit cannot be had; nothing has run then."""
    command, env = sandbox_command(args, readable=readable)
    group = create_cgroup(f"yimi-workshop-{uuid.uuid4().hex[:12]}", limits, cgroup_root)
    timed_out = False
    try:
        with tempfile.TemporaryDirectory(prefix="yimi-workshop-run-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            with out.open("wb") as stdout, err.open("wb") as stderr:
                join = [str(p) for p in group.procs_files]
                process = subprocess.Popen(
                    ["/bin/sh", "-c", JOIN_SCRIPT, "sh", *join, "--", *command],
                    env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, start_new_session=True,
                )
                try:
                    returncode = process.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    os.killpg(process.pid, signal.SIGKILL)
                    returncode = process.wait()
            if returncode == 125 and _tail(err).startswith(JOIN_FAILED):
                raise unavailable(_tail(err).strip()[:300])
            return SandboxResult(
                returncode=returncode, stdout=_tail(out), stderr=_tail(err), timed_out=timed_out,
                oom_killed=group.oom_killed(), pids_limited=group.pids_limited(), cpu_throttled=group.cpu_throttled(),
                cgroup_version=group.version,
            )
    finally:
        group.remove()
