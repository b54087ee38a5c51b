"""The platform side of pack hosts: MCP clients over stdio, started lazily, reclaimed idle.

Small packs (``runtime.host: shared``) that need nothing of their own share one host
process; every other pack gets its own (``Pack.host``). Every host runs sandboxed with
only what its packs declared (``sandbox.py``). A host starts on first use (listing or calling its tools) and is stopped once
it has been idle for its packs' ``idle_timeout_seconds`` (default 900). When a host sends
``notifications/tools/list_changed`` its tool list is read again and ``on_tools_changed``
is called, so runs see the new list without a restart.

A version the pack registry published lives in a directory of its own (outside the packs
directory) and always gets a dedicated host. When the registry switches a pack to another
version, the running host serves code from the old directory: the next use of it (or
``refresh_pack``) stops it, starts one for the new version, and announces the change as a
``tools/list_changed`` from a host would be (``tools_version``, ``on_tools_changed``).

All of this lives on one event loop per process (``runtime.py``): MCP sessions are bound
to the loop that opened them.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client

from capabilities.manifest import Pack, PackSet, load_packs
from capabilities.mcp_host.sandbox import PlatformPaths, grant_for, host_parameters
from yimi_project import call_capability
from yimi_project.logs import log_event


@dataclass
class ToolResult:
    structured: Any
    is_error: bool
    text: str
    transport_error: str | None = None


class HostProcess:
    """One host process and its MCP session, owned by a single task."""

    def __init__(
        self, key: str, params: StdioServerParameters, idle_timeout: float, on_changed: Callable[[str], None], errlog: Any,
        source: tuple[str, ...] = (),
    ) -> None:
        self.key, self.params, self.idle_timeout, self.errlog = key, params, idle_timeout, errlog
        self.source = source  # the directories of the pack versions it serves
        self.session: ClientSession | None = None
        self.tools: dict[str, types.Tool] = {}
        self.last_used = time.monotonic()
        self.error: BaseException | None = None
        self._on_changed = on_changed
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self, timeout: float = 20.0) -> None:
        # A context of its own: the host outlives the run that started it (whose context,
        # database thread included, ends with the run: brain.tasks.in_own_context).
        self._task = asyncio.get_running_loop().create_task(self._serve(), context=contextvars.Context())
        await asyncio.wait_for(self._ready.wait(), timeout)
        if self.session is None:
            raise RuntimeError(f"pack host {self.key} did not start: {self.error!r}")
        log_event("pack_host_started", host=self.key, tools=len(self.tools))

    @property
    def alive(self) -> bool:
        return self.session is not None and self._task is not None and not self._task.done()

    async def _serve(self) -> None:
        try:
            async with stdio_client(self.params, errlog=self.errlog) as (read, write):
                async with ClientSession(read, write, message_handler=self._on_message) as session:
                    await session.initialize()
                    self.session = session
                    await self.refresh_tools()
                    self._ready.set()
                    await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - recorded; callers see a dead host
            self.error = exc
        finally:
            self.session = None
            self._ready.set()

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            # Not awaited here: this handler runs inside the session's receive loop.
            asyncio.ensure_future(self._tools_changed())

    async def _tools_changed(self) -> None:
        await self.refresh_tools()
        log_event("pack_tools_changed", host=self.key, tools=len(self.tools))
        self._on_changed(self.key)

    async def refresh_tools(self) -> None:
        if self.session is not None:
            listed = await self.session.list_tools()
            self.tools = {t.name: t for t in listed.tools}

    async def call(self, name: str, arguments: dict[str, Any], timeout: float, capability: str | None = None) -> ToolResult:
        self.last_used = time.monotonic()
        if self.session is None:
            return ToolResult(None, True, "", transport_error="DISCONNECTED: the pack host is not running")
        meta: Any = {call_capability.META_KEY: capability} if capability else None
        try:
            result = await asyncio.wait_for(self.session.call_tool(name, arguments, meta=meta), timeout)
        except TimeoutError:
            return ToolResult(None, True, "", transport_error=f"TIMEOUT: no result within {timeout:g} s")
        except Exception as exc:  # noqa: BLE001 - the host died or the session broke
            return ToolResult(None, True, "", transport_error=f"DISCONNECTED: {type(exc).__name__}")
        finally:
            self.last_used = time.monotonic()
        text = " ".join(c.text for c in result.content if isinstance(c, types.TextContent))
        return ToolResult(result.structured_content, bool(result.is_error), text)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        log_event("pack_host_stopped", host=self.key)


class HostManager:
    def __init__(
        self,
        packs_dir: Path,
        *,
        paths: PlatformPaths | None = None,
        fake: bool = False,
        watch_interval: float = 1.0,
        on_tools_changed: Callable[[str], None] | None = None,
        log_dir: Path | None = None,
    ) -> None:
        self.packs_dir = Path(packs_dir)
        self.log_dir = log_dir
        self.paths = paths or PlatformPaths.from_settings()
        self.fake = fake
        self.watch_interval = watch_interval
        self.hosts: dict[str, HostProcess] = {}
        self.tools_version = 0
        self._on_tools_changed = on_tools_changed
        self._lock = asyncio.Lock()  # reclaiming and closing
        self._starting: dict[str, asyncio.Lock] = {}  # per host: one start at a time

    def packs(self) -> PackSet:
        return load_packs(self.packs_dir)

    def host_key(self, pack: Pack) -> str:
        shipped = pack.path.parent.resolve() == self.packs_dir.resolve()
        return "shared" if pack.host == "shared" and shipped else pack.name

    def _source(self, key: str) -> tuple[str, ...]:
        return tuple(sorted(str(p.path) for p in self.packs().packs.values() if self.host_key(p) == key))

    def _params(self, key: str) -> StdioServerParameters:
        """The sandboxed command for one host: only what its packs declared (sandbox.py).
        A published version's host reads the registry's directory of that version."""
        packs = [p for p in self.packs().packs.values() if self.host_key(p) == key]
        packs_dir = packs[0].path.parent.resolve() if key != "shared" and packs else self.packs_dir.resolve()
        args = ["-m", "capabilities.mcp_host.host", "--packs-dir", str(packs_dir), "--select", key,
                "--watch-interval", str(self.watch_interval)]
        if self.fake:
            args.append("--fake")
        return host_parameters(args, grant_for(packs, self.paths), readable=[packs_dir])

    def _errlog(self, key: str) -> Any:
        """Where a host's stderr goes: a log file per host, or this process's real stderr
        (not ``sys.stderr``, which a Celery worker replaces with an object without a file)."""
        if self.log_dir is None:
            return sys.__stderr__
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return open(self.log_dir / f"pack-host-{key}.log", "a", encoding="utf-8")  # noqa: SIM115 - kept for the host's life

    def _idle_timeout(self, key: str) -> float:
        packs = [p for p in self.packs().packs.values() if self.host_key(p) == key]
        return float(max((p.idle_timeout_seconds for p in packs), default=900))

    def _changed(self, key: str) -> None:
        self.tools_version += 1
        if self._on_tools_changed is not None:
            self._on_tools_changed(key)

    async def host(self, key: str) -> HostProcess:
        """The running host for ``key``, started now if it is not (lazy start). Hosts of
        different packs start at the same time (each takes seconds in its sandbox)."""
        async with self._starting.setdefault(key, asyncio.Lock()):
            current = self.hosts.get(key)
            source = self._source(key)
            if current is not None and current.alive and current.source == source:
                return current
            replaced = current is not None and current.alive
            if replaced and current is not None:
                await current.stop()  # it serves another version of the pack
            process = HostProcess(key, self._params(key), self._idle_timeout(key), self._changed, self._errlog(key), source)
            await process.start()
            self.hosts[key] = process
            if replaced:
                self._changed(key)
            return process

    async def refresh_pack(self, name: str) -> list[str]:
        """After the registry switched ``name`` to another version (or off): start the host
        of the version now selected (stopping the old one), or stop the host of a pack no
        longer selected, and announce the change; returns the tools served now."""
        pack = self.packs().packs.get(name)
        if pack is None:
            async with self._lock:
                host = self.hosts.pop(name, None)
                if host is not None:
                    await host.stop()
            self._changed(name)
            return []
        key = self.host_key(pack)
        current = self.hosts.get(key)
        was_running = current is not None and current.alive
        host = await self.host(key)
        if not was_running:  # a running host of another version was announced by host()
            self._changed(key)
        return sorted(n for n in host.tools if n.split("__", 1)[0] == name)

    async def list_tools(self, pack_names: list[str]) -> dict[str, types.Tool]:
        """The MCP tool definitions of these packs, starting their hosts if needed."""
        packs = self.packs()
        keys = sorted({self.host_key(packs.packs[n]) for n in pack_names if n in packs.packs})
        tools: dict[str, types.Tool] = {}
        for host in await asyncio.gather(*(self.host(key) for key in keys)):
            host.last_used = time.monotonic()
            tools.update({n: t for n, t in host.tools.items() if n.split("__", 1)[0] in pack_names})
        return tools

    async def call(
        self, full_name: str, arguments: dict[str, Any], *, timeout: float = 120.0, capability: str | None = None
    ) -> ToolResult:
        """Call one tool. ``capability`` is the call's pack capability (what the pack may do
        on the platform while it executes this call); without one it can do nothing there."""
        pack_name = full_name.split("__", 1)[0]
        pack = self.packs().packs.get(pack_name)
        if pack is None:
            return ToolResult(None, True, "", transport_error="DISCONNECTED: the pack is not installed")
        try:
            host = await self.host(self.host_key(pack))
        except Exception as exc:  # noqa: BLE001
            return ToolResult(None, True, "", transport_error=f"DISCONNECTED: the pack host failed to start ({exc})")
        return await host.call(full_name, arguments, timeout, capability)

    async def reclaim_idle(self, now: float | None = None) -> list[str]:
        """Stop hosts idle for their timeout or longer at ``now`` (``time.monotonic()``, which
        stamps ``last_used``, unless a test gives one); returns the stopped keys."""
        now = time.monotonic() if now is None else now
        stopped = []
        async with self._lock:
            for key, host in list(self.hosts.items()):
                if not host.alive or now - host.last_used >= host.idle_timeout:
                    await host.stop()
                    del self.hosts[key]
                    stopped.append(key)
        return stopped

    async def reclaim_forever(self, interval: float = 5.0) -> None:
        while True:
            await asyncio.sleep(interval)
            await self.reclaim_idle()

    async def close(self) -> None:
        """Stop every host, all at once: each takes its process's exit (about 0.3 s here),
        which one after another added up to seconds for a worker's shutdown."""
        async with self._lock:
            await asyncio.gather(*(host.stop() for host in self.hosts.values()))
            self.hosts.clear()
