"""Pack hosts over real MCP stdio: lazy start, idle reclaim, shared vs dedicated, and
tools/list_changed refreshing the tool list without a restart."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from capabilities.mcp_host.manager import HostManager
from capabilities.mcp_host.sandbox import PlatformPaths
from tests.support.gateway_support import copy_repo_pack, manifest, write_pack


def host_processes(marker: Path) -> list[str]:
    """The host processes serving this packs directory (the Python inside each sandbox,
    not the bwrap process that started it nor the ``sh`` that runs it in its limits)."""
    out = subprocess.run(["pgrep", "-af", "--", f"--packs-dir {marker}"], capture_output=True, text=True).stdout
    lines = [line.split(maxsplit=2) for line in out.splitlines()]
    return [
        line[2] for line in lines
        if len(line) == 3 and "capabilities.mcp_host.host" in line[2] and "bwrap" not in line[1] and not line[1].endswith("sh")
    ]


def platform_paths(tmp_path: Path) -> PlatformPaths:
    return PlatformPaths(
        data_dir=tmp_path / "data", workspace_dir=tmp_path / "ws", mail_dir=tmp_path / "mail",
        secrets_dir=tmp_path / "secrets", internal_socket=None,
    )


@pytest.fixture
def packs_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "packs"
    directory.mkdir()
    copy_repo_pack(directory, "workspace")
    write_pack(directory, "demo")
    write_pack(directory, "demo2", manifest("demo2"))
    write_pack(directory, "solo", manifest("solo", runtime={"server": "solo", "lazy": True, "idle_timeout_seconds": 1, "host": "dedicated"}))
    return directory


@pytest.fixture
def manager(packs_dir: Path, tmp_path: Path) -> Any:
    changes: list[str] = []
    m = HostManager(packs_dir, paths=platform_paths(tmp_path), watch_interval=0.2, on_tools_changed=changes.append)
    m.changes = changes  # type: ignore[attr-defined]
    yield m


async def test_hosts_start_lazily_on_first_use(manager: HostManager, packs_dir: Path) -> None:
    try:
        assert host_processes(packs_dir) == []
        result = await manager.call("workspace__write_file", {"path": "a.txt", "content": "hi"})
        assert result.structured["status"] == "succeeded" and not result.is_error
        assert len(host_processes(packs_dir)) == 1
    finally:
        await manager.close()
    assert host_processes(packs_dir) == []


async def test_small_packs_share_one_host_and_dedicated_packs_get_their_own(manager: HostManager, packs_dir: Path) -> None:
    try:
        await manager.call("demo2__read", {})
        await manager.call("demo__read", {})
        assert list(manager.hosts) == ["shared"]
        assert len(host_processes(packs_dir)) == 1
        await manager.call("solo__read", {})
        assert sorted(manager.hosts) == ["shared", "solo"]
        assert len(host_processes(packs_dir)) == 2
        # workspace asks for the shared host, but a pack holding a directory runs alone
        await manager.call("workspace__list_files", {})
        assert sorted(manager.hosts) == ["shared", "solo", "workspace"]
        tools = await manager.list_tools(["workspace", "solo"])
        assert "workspace__write_file" in tools and "solo__read" in tools and "demo__read" not in tools
    finally:
        await manager.close()


async def test_closing_stops_every_host_at_once(manager: HostManager, packs_dir: Path) -> None:
    """Each stop waits for its process to exit: ``close`` starts them all before any ends,
    instead of paying the exits one after another."""
    events: list[str] = []
    try:
        for tool in ("demo__read", "solo__read", "workspace__list_files"):
            await manager.call(tool, {})
        assert len(host_processes(packs_dir)) == 3
        for key, host in manager.hosts.items():
            async def stop(key: str = key, stop: Any = host.stop) -> None:
                events.append(f"start {key}")
                await stop()
                events.append(f"end {key}")

            host.stop = stop  # type: ignore[method-assign]
    finally:
        await manager.close()
    assert [e.split()[0] for e in events] == ["start"] * 3 + ["end"] * 3, events
    assert manager.hosts == {} and host_processes(packs_dir) == []


async def test_idle_hosts_are_reclaimed_after_their_timeout(manager: HostManager, packs_dir: Path) -> None:
    """solo's idle_timeout_seconds is 1, the shared host's 900: the clock is the test's
    (``reclaim_idle(now=...)``), so however long starting the hosts took does not count."""
    try:
        await manager.call("solo__read", {})
        await manager.call("demo__read", {})
        solo_used, shared_used = manager.hosts["solo"].last_used, manager.hosts["shared"].last_used
        assert await manager.reclaim_idle(now=solo_used + 0.999) == []  # just used
        assert await manager.reclaim_idle(now=solo_used + 1.001) == ["solo"]
        assert list(manager.hosts) == ["shared"]
        assert len(host_processes(packs_dir)) == 1
        assert await manager.reclaim_idle(now=shared_used + 899.999) == []  # the shared host has 900 s
        # used again: started again
        assert (await manager.call("solo__read", {})).structured["status"] == "succeeded"
        assert len(host_processes(packs_dir)) == 2
        assert await manager.reclaim_idle(now=shared_used + 900.001) == ["shared", "solo"]
    finally:
        await manager.close()


async def test_new_pack_in_the_shared_host_emits_tools_list_changed(manager: HostManager, packs_dir: Path) -> None:
    try:
        before = await manager.list_tools(["demo", "later"])
        assert not any(name.startswith("later__") for name in before)
        write_pack(packs_dir, "later")
        deadline = time.monotonic() + 60  # seen, not timed: the 60 s only bound a failure
        while not manager.changes:  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, "the shared host never announced the new pack"
            await asyncio.sleep(0.05)
        assert manager.changes == ["shared"]  # type: ignore[attr-defined]
        after = await manager.list_tools(["demo", "later"])
        assert "later__read" in after
        assert (await manager.call("later__read", {})).structured["status"] == "succeeded"
        assert len(host_processes(packs_dir)) == 1  # no restart
    finally:
        await manager.close()


async def test_a_crashing_tool_is_an_error_not_a_success(manager: HostManager, packs_dir: Path) -> None:
    broken = "from capabilities.packkit import ToolRegistry\nTOOLS = ToolRegistry()\n\n@TOOLS('x')\ndef read(args):\n    raise RuntimeError('boom')\n\n@TOOLS('x')\ndef note(args):\n    return 'not a receipt'\n\n@TOOLS('x')\ndef act(args):\n    return {}\n"
    shutil.rmtree(packs_dir / "demo")
    write_pack(packs_dir, "demo", tools_py=broken)
    try:
        crashed = await manager.call("demo__read", {})
        assert crashed.is_error and "boom" in crashed.text and crashed.structured is None
        no_receipt = await manager.call("demo__note", {})
        assert no_receipt.is_error
        missing = await manager.call("nopack__read", {})
        assert missing.transport_error and missing.transport_error.startswith("DISCONNECTED")
    finally:
        await manager.close()


async def test_fake_host_serves_the_same_tools(packs_dir: Path, tmp_path: Path) -> None:
    """The fake lists the same tools with the same input schemas and answers with the same
    receipt, but writes nothing where the real server writes (checked by the real one)."""
    paths = platform_paths(tmp_path)
    fake = HostManager(packs_dir, paths=paths, fake=True)
    real = HostManager(packs_dir, paths=paths)
    written = paths.workspace_dir / "a.txt"
    write = {"path": "a.txt", "content": "hi"}
    try:
        packs = ["workspace", "demo"]
        fake_tools, real_tools = await fake.list_tools(packs), await real.list_tools(packs)
        def shape(tools: dict[str, Any]) -> dict[str, Any]:
            return {n: (t.description, t.input_schema) for n, t in tools.items()}

        assert shape(fake_tools) == shape(real_tools)
        assert "workspace__write_file" in fake_tools
        faked = await fake.call("workspace__write_file", write)
        assert faked.structured["status"] == "succeeded" and faked.structured["effects"][0]["target"] == "a.txt"
        assert (await fake.call("workspace__read_file", {"path": "a.txt"})).structured["content"] == {"text": "hi"}
        assert not written.exists()  # the fake touches no disk
        assert (await real.call("workspace__write_file", write)).structured == faked.structured
        assert written.read_text() == "hi"  # where the real server wrote it: the path the fake left alone
    finally:
        await fake.close()
        await real.close()
