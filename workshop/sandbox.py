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
- **limits**: 256 MiB of memory, 0.5 CPU, at most 128
  processes, through a per-run cgroup made below this process's own cgroup
  (``capabilities.mcp_host.cgroups``, which pack hosts use too). cgroup v1
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
import uuid
from dataclasses import dataclass
from pathlib import Path

from capabilities.mcp_host import cgroups
from capabilities.mcp_host.cgroups import CGROUP_ROOT, Cgroup, CgroupLimits, CgroupUnavailable
from capabilities.mcp_host.sandbox import PackGrant, SandboxUnavailable, host_parameters
from yimi_project.errors import YimiError

MiB = 1024 * 1024
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


# --- cgroups (capabilities.mcp_host.cgroups, which pack hosts use too) ----------------------------


def create_cgroup(name: str, limits: SandboxLimits, root: Path = CGROUP_ROOT) -> Cgroup:
    """Make the run's cgroup below this process's own and set every limit (memory, CPU
    quota, processes), or raise ``sandbox_unavailable`` (having removed what was made)."""
    wanted = CgroupLimits(
        memory_bytes=limits.memory_bytes, pids=limits.pids, cpu_quota_us=limits.cpu_quota_us, cpu_period_us=limits.cpu_period_us
    )
    try:
        return cgroups.create_cgroup(name, wanted, root)
    except CgroupUnavailable as exc:
        if str(exc).startswith("no cgroup hierarchy"):
            raise unavailable(
                f"{exc}, so the workshop's limits (256 MiB, 0.5 CPU, 128 processes) cannot be enforced; builds do not run without them"
            ) from None
        raise unavailable(str(exc)) from None


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
