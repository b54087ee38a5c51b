"""The registry's honesty checks (issue 18, flow F4): the contract runs against the fake
and the real implementation in the bubblewrap pack sandbox, under strace, with an empty
network namespace. A read-only tool that writes a file, any socket that is not AF_UNIX,
and a result that receipt validation has to change all fail; an honest pack passes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from capabilities.registry import add_candidate
from capabilities.registry.candidates import store_path
from capabilities.registry.honesty import honesty_check, pack_events
from capabilities.registry_models import PackCandidate
from tests.conftest import need
from tests.support.registry_support import (
    FOUR_TOOL_CONTRACT,
    FOUR_TOOLS,
    HONEST_FOUR_TOOLS,
    WRITING_TOOLS,
    candidate_manifest,
    write_candidate,
)


@pytest.fixture(autouse=True)
def _registry(tmp_path: Path, settings: Any) -> None:
    need(bool(__import__("shutil").which("strace")), "strace is not installed")
    settings.YIMI_PACK_REGISTRY_DIR = tmp_path / "registry"


def four_tool_pack(root: Path, tools_py: str, fake_py: str) -> Path:
    manifest = candidate_manifest(tools=FOUR_TOOLS, provenance={"source": "workshop", "adapters": []})
    return write_candidate(root, tools_py=tools_py, fake_py=fake_py, manifest=manifest, contract=FOUR_TOOL_CONTRACT)


@pytest.mark.django_db
def test_an_honest_pack_passes_and_is_kept_by_its_digest(tmp_path: Path) -> None:
    """Its workspace tool writes a file: that is what it declares, so it is not held against it."""
    path = four_tool_pack(tmp_path / "src", HONEST_FOUR_TOOLS, HONEST_FOUR_TOOLS)
    lines: list[str] = []
    candidate = add_candidate(path, origin="workshop", built_against=None, progress=lines.append)
    assert candidate.honesty_report["findings"] == []
    assert candidate.state == PackCandidate.State.PASSED
    assert [run["implementation"] for run in candidate.honesty_report["runs"]] == ["fake", "real"]
    assert all(run["passed"] and run["steps"] == 4 for run in candidate.honesty_report["runs"])
    assert Path(candidate.path) == store_path(candidate.digest, "parcelcount")
    assert (Path(candidate.path) / "server" / "tools.py").read_text() == HONEST_FOUR_TOOLS
    assert any("honesty" in line for line in lines)


def test_a_read_only_tool_that_writes_or_opens_a_network_socket_is_caught(tmp_path: Path) -> None:
    """Only the real implementation lies (its fake is honest): the real run is traced too.
    The read-only ``count`` writes a cache file, the read-only ``ping`` opens an AF_INET
    socket, ``weigh`` reports a number without a unit; the workspace ``note`` writes, as
    declared, and is not named."""
    path = four_tool_pack(tmp_path, WRITING_TOOLS, HONEST_FOUR_TOOLS)
    report = honesty_check(path)
    messages = {f.code: [g.message for g in report.findings if g.code == f.code] for f in report.findings}
    assert not report.passed
    assert messages["read_only_wrote"] == ["real: count is declared read-only but openat wrote /tmp/parcel-cache.json"]
    assert messages["non_local_socket"] == ["real: ping opened a AF_INET socket"]
    assert messages["receipt_downgraded"] == ["real: weigh returned a receipt that validation had to downgrade"]
    assert not any("note" in m for ms in messages.values() for m in ms)
    assert not any(m.startswith("fake:") for ms in messages.values() for m in ms)


TRACE = """\
100 1.000000 execve("/usr/bin/bwrap", ["bwrap"], 0x0 /* 1 var */) = 0
100 1.100000 clone(child_stack=NULL, flags=CLONE_NEWNET|SIGCHLD) = 101
101 1.200000 socket(AF_NETLINK, SOCK_RAW|SOCK_CLOEXEC, NETLINK_ROUTE) = 5
101 1.210000 symlink("pts/ptmx", "/newroot/dev/ptmx") = 0
102 1.300000 execve("/usr/bin/python3", ["python3"], 0x0 /* 9 vars */) = 0
102 1.400000 openat(AT_FDCWD, "/usr/lib/python3/x.py", O_RDONLY|O_CLOEXEC) = 3
102 1.500000 socketpair(AF_UNIX, SOCK_STREAM|SOCK_CLOEXEC, 0, [4, 5]) = 0
103 2.000000 openat(AT_FDCWD, "/tmp/a", O_WRONLY|O_CREAT <unfinished ...>
102 2.000100 openat(AT_FDCWD, "/dev/null", O_RDWR|O_CLOEXEC) = 6
103 2.000200 <... openat resumed>, 0666) = -1 EROFS (Read-only file system)
103 2.100000 unlink("/tmp/b") = 0
103 2.200000 socket(AF_INET6, SOCK_DGRAM, IPPROTO_IP) = -1 EAFNOSUPPORT (Address family not supported by protocol)
"""


def test_the_trace_counts_the_packs_processes_attempts_included_and_not_bubblewraps_setup() -> None:
    events = [(e.pid, e.kind, e.syscall, e.detail) for e in pack_events(TRACE)]
    assert events == [
        (103, "write", "openat", "/tmp/a"),  # failed (read-only file system), still an attempt
        (103, "write", "unlink", "/tmp/b"),
        (103, "socket", "socket", "AF_INET6"),
    ]
