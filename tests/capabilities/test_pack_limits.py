"""Pack hosts run under limits on processes, memory, CPU time and open files (issue 35).

Real test packs in the real sandbox (bubblewrap), started by the platform's host manager:
a fork bomb, a memory hog, a CPU spinner and a file-descriptor leaker are each stopped by
their limit, the call ends with that limit's code, the host is replaced, and the next call
(to the same pack and to a well-behaved one) works. Each runs with the per-host cgroup
(``cgroup``, where this machine can make one) and with the rlimits alone (``rlimits``).
Nothing here measures time: the CPU limit is a few CPU seconds however long they take, and
every wait is a bound on a failure.

And the gateway refuses a call to a pack whose host cannot start (``pack_unavailable``)
before recording it as executing, so it neither ends ``unknown`` nor holds its target.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from brain.services import accept_utterance
from capabilities.client import call_tool
from capabilities.manifest import ManifestError, load_pack, load_packs
from capabilities.mcp_host import limits as pack_limits
from capabilities.mcp_host import runtime
from capabilities.mcp_host.cgroups import CgroupLimits, CgroupUnavailable, create_cgroup
from capabilities.mcp_host.limits import PackLimits
from capabilities.mcp_host.manager import HostManager
from capabilities.mcp_host.sandbox import PlatformPaths
from capabilities.models import ReceiptRecord, ToolCall
from capabilities.receipts import normalize
from tests.conftest import need, need_program, new_client_id
from tests.support.gateway_support import DEMO_TOOLS, manifest, write_pack

GREEDY_TOOLS = r'''
import os, sys, time
from capabilities.packkit import ToolRegistry, receipt, value

TOOLS = ToolRegistry()
MiB = 1024 * 1024


@TOOLS("Fork until refused.", {"type": "object"})
def fork_bomb(args):
    r, w = os.pipe()
    made = 0
    try:
        while made < 1000:
            pid = os.fork()
            if pid == 0:
                os.close(w)
                os.read(r, 1)  # every child waits for a byte that never comes
                os._exit(0)
            made += 1
    except OSError as exc:
        raise BlockingIOError(exc.errno, f"fork refused after {made} children") from None
    return receipt("succeeded", values=[value("children", made, "count", "fork_bomb")])


@TOOLS("Allocate memory until refused.", {"type": "object"})
def hog(args):
    chunks = []
    try:
        while len(chunks) < 192:  # 1.5 GiB: past every limit here, and bounded should they fail
            chunks.append(b"x" * (8 * MiB))  # written, so resident
            print(f"allocated {8 * len(chunks)} MiB", file=sys.stderr, flush=True)
    except MemoryError:
        raise MemoryError(f"refused after {8 * len(chunks)} MiB") from None
    return receipt("succeeded", values=[value("allocated", 8 * len(chunks), "MiB", "hog")])


@TOOLS("Fill /tmp until refused.", {"type": "object"})
def fill_tmp(args):
    written = 0
    try:
        with open("/tmp/fill", "wb") as fh:
            while written < 1024:  # past the limit, and bounded should it fail
                fh.write(b"x" * MiB)
                fh.flush()
                written += 1
    except OSError as exc:
        return receipt("failed", error=("ENOSPC", str(exc.errno)), values=[value("written", written, "MiB", "fill_tmp")])
    return receipt("succeeded", values=[value("written", written, "MiB", "fill_tmp")])


@TOOLS("Spin on the CPU forever.", {"type": "object"})
def spin(args):
    n = 0
    while True:
        n += 1


@TOOLS("Spin until this host used this many CPU seconds.", {"type": "object", "properties": {"seconds": {"type": "number"}}})
def burn(args):
    while time.process_time() < args["seconds"]:
        pass
    return receipt("succeeded", values=[value("cpu", round(time.process_time(), 1), "s", "burn")])


@TOOLS("Open files until refused.", {"type": "object"})
def leak_fds(args):
    kept = []
    try:
        while len(kept) < 4096:
            kept.append(open("/dev/null", "rb"))
    except OSError as exc:
        raise OSError(exc.errno, f"open refused after {len(kept)} files") from None
    return receipt("succeeded", values=[value("files", len(kept), "count", "leak_fds")])


@TOOLS("Behave.", {"type": "object"})
def ok(args):
    return receipt("succeeded", values=[value("answer", 42, "unit", "ok")])
'''
GREEDY_LIMITS = {"processes": 32, "memory_mib": 256, "cpu_seconds": 6, "open_files": 64}
TOOL_NAMES = ("fork_bomb", "hog", "fill_tmp", "spin", "burn", "leak_fds", "ok")
TIMEOUT = 300.0  # a bound on a broken limit, never reached by a passing test


def greedy_manifest(limits: dict[str, int] | None = None, **overrides: Any) -> dict[str, Any]:
    tools = {name: {"effect": "observe"} for name in TOOL_NAMES}
    runtime = {"server": "greedy", "lazy": True, "idle_timeout_seconds": 900, "host": "dedicated"}
    return manifest("greedy", tools=tools, runtime=runtime, limits=limits or GREEDY_LIMITS, **overrides)


def cgroups_usable() -> bool:
    try:
        group = create_cgroup(f"yimi-pack-probe-{os.getpid()}-{os.urandom(4).hex()}", CgroupLimits(memory_bytes=64 << 20, pids=16))
    except CgroupUnavailable:
        return False
    group.remove()
    return True


@pytest.fixture
def packs_dir() -> Iterator[Path]:
    """Readable by everyone (not under pytest's 0700 tmp_path): one test runs its host as
    an unprivileged user."""
    root = Path(tempfile.mkdtemp(prefix="yimi-pack-limits-"))
    root.chmod(0o755)
    packs = root / "packs"
    packs.mkdir()
    write_pack(packs, "greedy", data=greedy_manifest(), tools_py=GREEDY_TOOLS)
    write_pack(packs, "demo")
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield packs
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["cgroup", "rlimits"])
def mode(request: Any, settings: Any) -> str:
    need_program("bwrap", "bubblewrap")
    settings.YIMI_PACK_SANDBOX = "bwrap"
    if request.param == "cgroup":
        need(cgroups_usable(), "a writable cgroup hierarchy with the memory and pids controllers (root) is needed")
        settings.YIMI_PACK_CGROUPS = "auto"
    else:
        settings.YIMI_PACK_CGROUPS = "off"
    return str(request.param)


@pytest.fixture
async def manager(packs_dir: Path, tmp_path: Path, mode: str) -> AsyncIterator[HostManager]:
    paths = PlatformPaths(tmp_path / "data", tmp_path / "ws", tmp_path / "mail", tmp_path / "secrets", None)
    m = HostManager(packs_dir, paths=paths, log_dir=tmp_path / "logs")
    yield m
    await m.close()
    assert left_in_sandbox(packs_dir) == []  # every host, and all they started, is gone


async def call(manager: HostManager, tool: str, **args: Any) -> Any:
    return await manager.call(tool, args, timeout=TIMEOUT)


def left_in_sandbox(packs_dir: Path) -> list[str]:
    """Processes still running from this test's packs directory (a host, or anything it forked)."""
    out = subprocess.run(["pgrep", "-af", "--", f"--packs-dir {packs_dir}"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "capabilities.mcp_host.host" in line]


async def still_works(manager: HostManager) -> None:
    """The platform is up: the same pack (on a new host) and a well-behaved one answer."""
    again = await call(manager, "greedy__ok")
    assert again.structured["status"] == "succeeded", again
    other = await call(manager, "demo__read")
    assert other.structured["status"] == "succeeded", other


def stopped_by(result: Any, limit: str) -> None:
    code = pack_limits.CODES[limit]
    assert result.limit == limit and result.transport_error.startswith(f"{code}: the pack's host was stopped"), result


async def test_a_fork_bomb_is_stopped_at_the_process_limit(manager: HostManager, packs_dir: Path, mode: str) -> None:
    if mode == "rlimits" and os.geteuid() == 0:
        pytest.skip("the kernel does not apply RLIMIT_NPROC to uid 0: test_rlimits_bound_a_fork_bomb_of_an_unprivileged_platform")
    result = await call(manager, "greedy__fork_bomb")
    stopped_by(result, "processes")
    made = int(re.search(r"after (\d+) children", result.text).group(1))  # type: ignore[union-attr]
    assert 10 <= made < GREEDY_LIMITS["processes"]  # the limit, not something else, stopped it
    assert "greedy" not in manager.hosts  # stopped, with every child; the next call starts another
    assert [p for p in left_in_sandbox(packs_dir) if "--select greedy" in p] == []
    await still_works(manager)


RLIMIT_FORK_BOMB = """
import os, sys
sys.path.insert(0, sys.argv[1])
from capabilities.mcp_host import limits
wanted = limits.PackLimits(processes=32, memory_mib=256, cpu_seconds=60, open_files=64)
limits.apply(wanted)  # what the host does first, inside its sandbox
r, w = os.pipe()
made = 0
try:
    while made < 1000:
        pid = os.fork()
        if pid == 0:
            os.close(w)
            os.read(r, 1)  # until the parent exits
            os._exit(0)
        made += 1
except OSError as exc:
    print(made, limits.limit_hit(exc, wanted))
else:
    print(made, None)
"""


def test_rlimits_bound_a_fork_bomb_of_an_unprivileged_platform() -> None:
    """Without a cgroup only RLIMIT_NPROC bounds processes, and the kernel applies it only
    to a platform that is not root (the compose stack's uid 10001), counting the tasks of the
    sandbox's own user namespace. As root, this runs the sandbox as nobody (setpriv), as
    such a platform would, with the system's Python and a copy of ``limits.py`` (nobody may
    not read every checkout and virtualenv)."""
    need_program("bwrap", "bubblewrap")
    sandbox_user: list[str] = []
    if os.geteuid() == 0:
        need_program("setpriv", "util-linux")
        sandbox_user = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--"]
    copy = Path(tempfile.mkdtemp(prefix="yimi-rlimit-"))
    try:
        package = copy / "capabilities" / "mcp_host"
        package.mkdir(parents=True)
        for name in ("capabilities/__init__.py", "capabilities/mcp_host/__init__.py"):
            (copy / name).write_text("")
        shutil.copy(pack_limits.__file__, package / "limits.py")
        (copy / "bomb.py").write_text(RLIMIT_FORK_BOMB)
        for path in [copy, *copy.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        command = [
            *sandbox_user, "bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--uid", "65534", "--gid", "65534",
            "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--ro-bind", str(copy), "/tmp/bomb",
            "--", "/usr/bin/python3", "/tmp/bomb/bomb.py", "/tmp/bomb",
        ]
        out = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    made, hit = out.stdout.split() if out.stdout else ("?", out.stderr)
    assert hit == "processes", out
    assert 20 <= int(made) < 32  # bubblewrap's process and the program itself count too


async def test_a_memory_hog_is_stopped_at_the_memory_limit(manager: HostManager, tmp_path: Path, mode: str) -> None:
    result = await call(manager, "greedy__hog")
    stopped_by(result, "memory_mib")
    logged = [int(n) for n in re.findall(r"allocated (\d+) MiB", (tmp_path / "logs" / "pack-host-greedy.log").read_text())]
    if mode == "cgroup":  # killed at the cgroup's 256 MiB (the host's own ~60 MiB count too)
        assert max(logged, default=0) < GREEDY_LIMITS["memory_mib"]
    else:  # refused at the address-space limit: 256 MiB + the headroom for reserved space
        refused = int(re.search(r"refused after (\d+) MiB", result.text).group(1))  # type: ignore[union-attr]
        assert GREEDY_LIMITS["memory_mib"] <= refused < GREEDY_LIMITS["memory_mib"] + pack_limits.ADDRESS_SPACE_HEADROOM_MIB
    await still_works(manager)


@pytest.mark.parametrize("mode", ["rlimits"], indirect=True)  # an rlimit alone: a cgroup would add nothing
async def test_a_cpu_spinner_is_stopped_by_its_cpu_time(manager: HostManager) -> None:
    result = await call(manager, "greedy__spin")
    stopped_by(result, "cpu_seconds")
    await still_works(manager)


@pytest.mark.parametrize("mode", ["rlimits"], indirect=True)  # an rlimit alone: a cgroup would add nothing
async def test_an_fd_leaker_is_stopped_at_the_open_files_limit(manager: HostManager) -> None:
    result = await call(manager, "greedy__leak_fds")
    stopped_by(result, "open_files")
    opened = int(re.search(r"refused after (\d+) files", result.text).group(1))  # type: ignore[union-attr]
    assert 32 <= opened < GREEDY_LIMITS["open_files"]
    await still_works(manager)


@pytest.mark.parametrize("mode", ["rlimits"], indirect=True)  # with a cgroup, /tmp's pages count as its memory
async def test_the_sandbox_tmp_is_no_bigger_than_the_memory_limit(manager: HostManager) -> None:
    """``/tmp`` is memory (a tmpfs): without a cgroup to count it, its size is the bound."""
    result = await call(manager, "greedy__fill_tmp")
    written = result.structured["values"][0]["value"]
    assert result.structured["status"] == "failed" and 128 <= written <= GREEDY_LIMITS["memory_mib"], result


@pytest.mark.parametrize("mode", ["rlimits"], indirect=True)  # an rlimit alone: a cgroup would add nothing
async def test_a_host_that_used_half_its_cpu_time_is_replaced_between_calls(manager: HostManager) -> None:
    """RLIMIT_CPU counts a host's whole life: a busy, well-behaved host is replaced before it
    could run out in the middle of a call."""
    half = GREEDY_LIMITS["cpu_seconds"] * pack_limits.RETIRE_AT
    used = await call(manager, "greedy__burn", seconds=half)
    assert used.structured["status"] == "succeeded" and used.cpu_seconds >= half
    first = manager.hosts["greedy"]
    assert first.retiring
    assert (await call(manager, "greedy__ok")).structured["status"] == "succeeded"
    assert manager.hosts["greedy"] is not first and not manager.hosts["greedy"].retiring


def test_the_registry_preloads_a_candidate_under_the_limits_it_will_run_under(tmp_path: Path, settings: Any) -> None:
    """A version that cannot even load within its limits is not published (``preload_failed``)."""
    from capabilities.registry.publish import PreloadError, preload

    need_program("bwrap", "bubblewrap")
    settings.YIMI_PACK_SANDBOX = "bwrap"
    big_at_import = "BALLAST = b'x' * (1024 * 1024 * 1024)  # 1 GiB, more than its limits allow\n" + DEMO_TOOLS
    write_pack(tmp_path, "heavy", data=manifest("heavy", limits={"memory_mib": 64}), tools_py=big_at_import)
    with pytest.raises(PreloadError, match=r"the host serves \[\]"):  # its host refused the pack it could not load
        preload(tmp_path / "heavy")


# --- the manifest's limits block ---------------------------------------------------------------


def test_a_pack_may_ask_for_other_limits_up_to_the_ceiling_and_gets_a_host_of_its_own(tmp_path: Path, settings: Any) -> None:
    settings.YIMI_PACK_LIMIT_CEILINGS = {"processes": 64, "memory_mib": 1024, "cpu_seconds": 60, "open_files": 128}
    settings.YIMI_PACK_LIMITS = {"processes": 48, "memory_mib": 256, "cpu_seconds": 30, "open_files": 100}
    runtime = {"server": "x", "lazy": True, "host": "shared"}
    write_pack(tmp_path, "asks", data=manifest("asks", runtime=runtime, limits={"memory_mib": 1024, "open_files": 64}))
    write_pack(tmp_path, "plain", data=manifest("plain", runtime=runtime))
    asks, plain = load_pack(tmp_path / "asks"), load_pack(tmp_path / "plain")
    assert pack_limits.for_packs([asks]) == PackLimits(processes=48, memory_mib=1024, cpu_seconds=30, open_files=64)
    assert pack_limits.for_packs([plain]) == PackLimits(processes=48, memory_mib=256, cpu_seconds=30, open_files=100)
    assert (asks.host, plain.host) == ("dedicated", "shared")  # a shared process would share its limits


def test_a_limit_over_the_ceiling_is_a_manifest_error_with_its_code(tmp_path: Path, settings: Any) -> None:
    settings.YIMI_PACK_LIMIT_CEILINGS = {"processes": 64, "memory_mib": 1024, "cpu_seconds": 60, "open_files": 128}
    settings.YIMI_PACK_LIMITS = {"processes": 48, "memory_mib": 256, "cpu_seconds": 30, "open_files": 100}
    write_pack(tmp_path, "greedy", data=greedy_manifest({"memory_mib": 2048, "processes": 64}))
    with pytest.raises(ManifestError) as refused:
        load_pack(tmp_path / "greedy")
    assert refused.value.code == "pack_limit_over_ceiling"
    assert str(refused.value) == "pack_limit_over_ceiling: limits.memory_mib is 2048, above the platform's ceiling of 1024"
    assert load_packs(tmp_path).refused["greedy"].startswith("pack_limit_over_ceiling: ")  # the rest load


@pytest.mark.parametrize(
    ("limits", "problem"),
    [({"memory_mib": 16}, "16 is less than the minimum of 64"), ({"threads": 4}, "Additional properties"), ({"cpu_seconds": "10"}, "not of type")],
)
def test_the_limits_block_is_validated(tmp_path: Path, limits: dict[str, Any], problem: str) -> None:
    write_pack(tmp_path, "greedy", data=greedy_manifest(limits))
    with pytest.raises(ManifestError, match=problem):
        load_pack(tmp_path / "greedy")


# --- what a call's receipt says ------------------------------------------------------------


def test_a_call_its_host_was_stopped_for_is_unknown_with_the_limits_code() -> None:
    lost = normalize(None, tool=None, category="send", transport_error="pack_limit_memory: the pack's host was stopped: it used more")
    assert lost.receipt["status"] == "unknown" and lost.receipt["error"]["code"] == "pack_limit_memory"
    assert lost.receipt["next"]["retry"] == "after_check"  # it may have acted before it was stopped


def test_a_call_no_host_could_run_failed_and_needs_no_check() -> None:
    out = normalize(None, tool=None, category="send", transport_error="pack_unavailable: its host did not start (it exited with status 3)")
    assert out.receipt["status"] == "failed" and out.receipt["error"]["code"] == "pack_unavailable"
    assert out.receipt["next"] == {"retry": "allowed"} and out.violations == []
    assert json.dumps(out.receipt)  # a valid receipt: normalize's own schema check passes it through again
    assert normalize(out.receipt, tool=None, category="send").receipt == out.receipt


# --- through the gateway ------------------------------------------------------------------------

EXITS_AT_IMPORT = "import os\nos._exit(3)  # the host dies loading this pack, before it can serve anything\n"


@pytest.fixture
def gateway_packs(tmp_path: Path, settings: Any) -> Iterator[Path]:
    need_program("bwrap", "bubblewrap")
    packs = tmp_path / "packs"
    packs.mkdir()
    write_pack(packs, "greedy", data=greedy_manifest(), tools_py=GREEDY_TOOLS)
    dedicated = {"server": "flaky", "lazy": True, "idle_timeout_seconds": 900, "host": "dedicated"}
    write_pack(packs, "flaky", data=manifest("flaky", runtime=dedicated), tools_py=EXITS_AT_IMPORT)
    settings.YIMI_PACKS_DIR = packs
    settings.YIMI_PACK_SANDBOX = "bwrap"
    runtime.reset_for_tests()
    yield packs
    runtime.reset_for_tests()


@pytest.mark.django_db(transaction=True)
def test_a_call_to_a_pack_whose_host_cannot_start_is_refused_before_it_runs(
    gateway_packs: Path, make_device: Any, settings: Any
) -> None:
    """Refused by the gateway with ``pack_unavailable``, recorded as refused (not executing):
    nothing ends ``unknown``, so once the pack can run, the same call on the same target runs."""
    run = accept_utterance(make_device().device, new_client_id(), "记一下")
    refused = asyncio.run(call_tool(str(run.run_id), "", "flaky__note", {"text": "hello"}))
    assert (refused.decision, refused.code, refused.executed) == ("block", "pack_unavailable", False), refused
    assert "its host did not start (it exited with status 3)" in refused.model_text
    recorded = ToolCall.objects.get(id=refused.call_id)
    assert (recorded.decision, recorded.decision_code) == ("block", "pack_unavailable")
    assert list(ReceiptRecord.objects.values_list("status", "written_by_gateway")) == [("rejected", True)]
    # Until it is tried again (YIMI_PACK_HOST_RETRY_SECONDS), the next call is refused at once.
    again = asyncio.run(call_tool(str(run.run_id), "", "flaky__read", {}))
    assert again.code == "pack_unavailable"

    settings.YIMI_PACK_HOST_RETRY_SECONDS = 0
    (gateway_packs / "flaky" / "server" / "tools.py").write_text(DEMO_TOOLS)  # the pack is mended
    ran = asyncio.run(call_tool(str(run.run_id), "", "flaky__note", {"text": "hello"}))
    assert ran.executed and ran.receipt is not None and ran.receipt["status"] == "succeeded", ran.model_text
    assert not ReceiptRecord.objects.filter(status="unknown").exists()


@pytest.mark.django_db(transaction=True)
def test_a_call_stopped_by_a_limit_ends_with_its_code_and_the_next_call_works(gateway_packs: Path, make_device: Any) -> None:
    run = accept_utterance(make_device().device, new_client_id(), "看看")
    hog = asyncio.run(call_tool(str(run.run_id), "", "greedy__hog", {}))
    assert hog.executed and hog.receipt is not None
    assert (hog.receipt["status"], hog.receipt["error"]["code"]) == ("unknown", "pack_limit_memory"), hog.receipt
    assert "256 MiB of memory" in hog.receipt["error"]["message"]
    ok = asyncio.run(call_tool(str(run.run_id), "", "greedy__ok", {}))
    assert ok.receipt is not None and ok.receipt["status"] == "succeeded"


# --- what a platform process that dies leaves behind ------------------------------------------

LAUNCHER = """
import json, os, subprocess, sys
argv, env = json.loads(sys.argv[1]), json.loads(sys.argv[2])
host = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
host.stdout.readline()  # its sandbox runs
os._exit(0)  # and the platform process dies without stopping it
"""


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_host_does_not_outlive_the_platform_process_that_started_it(tmp_path: Path) -> None:
    """The wrapper between the platform and bubblewrap dies with the platform (its parent
    death signal), so bubblewrap's --die-with-parent still ends the sandbox: a host busy in
    a loop that never reads its stdin again is not left running."""
    from capabilities.mcp_host.sandbox import PackGrant, host_parameters

    need_program("bwrap", "bubblewrap")
    need_program("setpriv", "util-linux")
    marker = f"orphan-probe-{os.urandom(6).hex()}"
    busy = f"import sys\nprint('ready', flush=True)\nwhile True:\n    pass  # {marker}\n"
    guard = pack_limits.HostGuard.make("probe", PackLimits(processes=16, memory_mib=128, cpu_seconds=120, open_files=64), cgroups="off")
    try:
        params = guard.wrap(host_parameters(["-c", busy], PackGrant(), readable=[], mode="bwrap"))
        subprocess.run(
            [sys.executable, "-c", LAUNCHER, json.dumps([params.command, *params.args]), json.dumps(params.env)],
            check=True, timeout=TIMEOUT,
        )
        for _ in range(600):  # a bound on a failure: they are killed as the launcher exits
            if not processes_with(marker):
                break
            time.sleep(0.05)
        assert processes_with(marker) == []
    finally:
        for pid in processes_with(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        guard.release()


def test_leftovers_of_a_platform_process_that_died_are_removed(monkeypatch: Any) -> None:
    """Cgroups and status files are named by the platform process that made them: once it is
    gone, the next process to start a host removes them; a live process's are kept."""
    need(cgroups_usable(), "a writable cgroup hierarchy with the memory and pids controllers (root) is needed")
    ended = subprocess.Popen(["true"])
    ended.wait()
    limits = CgroupLimits(memory_bytes=64 << 20, pids=16)
    tag = os.urandom(4).hex()
    dead_group = create_cgroup(f"{pack_limits.CGROUP_PREFIX}probe{tag}-{ended.pid}-{tag}", limits)
    live_group = create_cgroup(f"{pack_limits.CGROUP_PREFIX}probe{tag}-{os.getpid()}-{tag}", limits)
    dead_status = Path(tempfile.gettempdir()) / f"{pack_limits.STATUS_PREFIX}{ended.pid}-{tag}.status"
    live_status = Path(tempfile.gettempdir()) / f"{pack_limits.STATUS_PREFIX}{os.getpid()}-{tag}.status"
    dead_status.write_text("0\n")
    live_status.write_text("")
    try:
        monkeypatch.setattr(pack_limits, "_swept", False)  # as in a process that starts its first host
        pack_limits.HostGuard.make("probe", PackLimits(processes=16, memory_mib=128, cpu_seconds=60, open_files=64), cgroups="off").release()
        assert not any(d.exists() for d in dead_group.dirs.values()) and not dead_status.exists()
        assert all(d.exists() for d in live_group.dirs.values()) and live_status.exists()
    finally:
        dead_group.remove()
        live_group.remove()
        live_status.unlink(missing_ok=True)
        dead_status.unlink(missing_ok=True)
