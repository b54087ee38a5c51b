"""The workshop sandbox enforces its limits (``workshop/sandbox.py``: 256 MiB, 0.5 CPU, 128 processes; issue 18).

Each test runs a small Python program through ``workshop.sandbox.run_sandboxed``, the way
a build's self-test runs: real bubblewrap, a real per-run cgroup (v1 on this machine kind).
Nothing here measures time.
"""

from __future__ import annotations

import socket
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from tests.conftest import need
from workshop import sandbox
from workshop.sandbox import SandboxLimits, run_sandboxed
from yimi_project.errors import YimiError

TIMEOUT = 120.0  # a bound on a broken sandbox, never reached by a passing test


def usable() -> bool:
    try:  # a name of its own: test processes running side by side (xdist workers) probe at once
        group = sandbox.create_cgroup(f"yimi-workshop-probe-{uuid.uuid4().hex[:12]}", sandbox.WORKSHOP_LIMITS)
    except YimiError:
        return False
    group.remove()
    return True


@pytest.fixture(autouse=True)
def _needs_sandbox() -> None:
    need(usable() and Path("/usr/bin/bwrap").exists(), "bubblewrap and writable cgroups (root) are needed")


def run(tmp_path: Path, code: str, **kwargs: object) -> sandbox.SandboxResult:
    program = tmp_path / "program.py"
    program.write_text(code)
    return run_sandboxed([str(program)], readable=[tmp_path], timeout=TIMEOUT, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def made_cgroups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the cgroups this test's runs make (``sandbox.create_cgroup``): other
    test processes on the machine (xdist workers) make and remove their own meanwhile."""
    names: list[str] = []
    create = sandbox.create_cgroup

    def recording(name: str, *args: Any, **kwargs: Any) -> sandbox.Cgroup:
        names.append(name)
        return create(name, *args, **kwargs)

    monkeypatch.setattr(sandbox, "create_cgroup", recording)
    return names


def leftover_cgroups(names: list[str]) -> list[Path]:
    """Which of the cgroups ``names`` still exist, under any controller."""
    assert names, "the test made no cgroup"
    return [p for name in names for p in Path("/sys/fs/cgroup").glob(f"*/**/{name}") if p.is_dir()]


def test_a_build_that_allocates_512_mib_dies(tmp_path: Path) -> None:
    result = run(tmp_path, "data = bytearray(512 * 1024 * 1024)\nprint('allocated', len(data))\n")
    assert result.oom_killed and not result.ok
    assert "allocated" not in result.stdout
    assert "memory limit" in result.describe()


def test_a_build_within_the_memory_limit_runs(tmp_path: Path) -> None:
    result = run(tmp_path, "data = bytearray(64 * 1024 * 1024)\nprint('allocated', len(data))\n")
    assert result.ok and not result.oom_killed
    assert "allocated 67108864" in result.stdout


FORK_BOMB = """
import os
r, w = os.pipe()
made, refused = 0, None
while made < 1000:
    try:
        pid = os.fork()
    except OSError as exc:
        refused = exc.errno
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)   # every child waits until the parent exits
        os._exit(0)
    made += 1
print(made, refused)
"""


def test_a_fork_bomb_stops_at_128_processes(tmp_path: Path, made_cgroups: list[str]) -> None:
    result = run(tmp_path, FORK_BOMB)
    made, refused = result.stdout.split()
    # bubblewrap's two processes and the program itself count: 128 in all.
    assert int(made) <= 128 - 3
    assert int(made) >= 100  # the limit, not something else, stopped it
    assert refused == "11"  # EAGAIN from fork
    assert result.pids_limited
    assert leftover_cgroups(made_cgroups) == []


def test_the_sandbox_cannot_read_the_data_dir(tmp_path: Path) -> None:
    data_dir = Path(django_settings.DATA_DIR)
    probe = data_dir / "workshop-probe.txt"
    probe.write_text("conversation")
    try:
        result = run(
            tmp_path,
            f"import os\nfor p in ({str(probe)!r}, {str(data_dir)!r}):\n"
            "    try:\n        print('READ', os.listdir(p) if os.path.isdir(p) else open(p).read())\n"
            "    except OSError as exc:\n        print('refused', type(exc).__name__)\n",
        )
    finally:
        probe.unlink()
    assert result.ok
    assert "READ" not in result.stdout and result.stdout.count("refused FileNotFoundError") == 2


def test_the_sandbox_cannot_reach_127_0_0_1(tmp_path: Path) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        try:
            accepted.append(listener.accept())
        except OSError:
            pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        result = run(
            tmp_path,
            "import socket\ntry:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=5)\n    print('CONNECTED')\n"
            "except OSError as exc:\n    print('refused', type(exc).__name__)\n",
        )
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        listener.close()
        thread.join(10)
    assert result.ok
    assert "CONNECTED" not in result.stdout and "refused ConnectionRefusedError" in result.stdout
    assert accepted == []


def test_the_root_is_read_only_and_the_build_directory_too(tmp_path: Path) -> None:
    result = run(
        tmp_path,
        "for p in ('/written', " + repr(str(tmp_path / "written")) + "):\n"
        "    try:\n        open(p, 'w').write('x')\n        print('WROTE', p)\n"
        "    except OSError as exc:\n        print('refused', exc.errno)\n"
        "open('/tmp/scratch', 'w').write('own /tmp is fine')\nprint('tmp ok')\n",
    )
    assert result.ok, result.stderr
    assert "WROTE" not in result.stdout and result.stdout.count("refused 30") == 2  # EROFS
    assert "tmp ok" in result.stdout


def test_limits_that_cannot_be_enforced_fail_clearly_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(YimiError) as refused:
        run(tmp_path, f"open({str(marker)!r}, 'w')\n", cgroup_root=tmp_path / "no-cgroups")
    assert refused.value.code == "sandbox_unavailable"
    assert "cannot be enforced" in refused.value.message
    assert not marker.exists()


def test_a_limit_the_kernel_refuses_fails_the_run(tmp_path: Path, made_cgroups: list[str]) -> None:
    with pytest.raises(YimiError) as refused:
        run(tmp_path, "print('ran')\n", limits=SandboxLimits(cpu_quota_us=10))  # below the kernel's 1 ms minimum
    assert refused.value.code == "sandbox_unavailable"
    assert "cpu.cfs_quota_us" in refused.value.message
    assert leftover_cgroups(made_cgroups) == []


def test_output_cannot_fill_the_hosts_disk(tmp_path: Path) -> None:
    result = run(tmp_path, "import sys\nchunk = 'x' * 65536\nfor _ in range(400):\n    sys.stdout.write(chunk)\nprint('ALL WRITTEN')\n")
    assert not result.ok and "ALL WRITTEN" not in result.stdout  # 25 MiB > the 8 MiB file size limit
    assert result.returncode == 1 and "File too large" in result.stderr  # EFBIG (Python ignores SIGXFSZ)


def test_the_runs_cgroup_holds_the_workshop_limits_and_is_removed() -> None:
    # Whether a busy program gets throttled depends on the machine's load; the quota itself does not.
    group = sandbox.create_cgroup("yimi-workshop-limits-probe", sandbox.WORKSHOP_LIMITS)
    try:
        if group.version == "v1":  # this machine kind mounts memory, cpu and pids as v1
            read = {name: (group.dirs[ctl] / name).read_text().strip() for ctl, name in (
                ("memory", "memory.limit_in_bytes"), ("cpu", "cpu.cfs_quota_us"), ("cpu", "cpu.cfs_period_us"), ("pids", "pids.max"))}
            assert read == {"memory.limit_in_bytes": str(256 * 1024 * 1024), "cpu.cfs_quota_us": "50000",
                            "cpu.cfs_period_us": "100000", "pids.max": "128"}
        else:
            read = {name: (group.dirs[""] / name).read_text().strip() for name in ("memory.max", "cpu.max", "pids.max")}
            assert read == {"memory.max": str(256 * 1024 * 1024), "cpu.max": "50000 100000", "pids.max": "128"}
    finally:
        group.remove()
    assert not any(d.exists() for d in group.dirs.values())
