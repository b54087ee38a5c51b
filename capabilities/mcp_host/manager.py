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

Every host runs under its limits (``limits.py``: processes, memory, CPU time, open files;
rlimits always, a cgroup where one can be made). A call that ends because its host reached
one (the host died of it, or reported a handler that failed for lack of it) stops the
host, and its result is the limit's code (``pack_limit_memory``...); the next call starts
a fresh host. A host that lost its process (crashed) is replaced the same way, and one that
used half its CPU time is replaced before its next call once no call runs on it. A host
that cannot start is not tried again for ``YIMI_PACK_HOST_RETRY_SECONDS``: until then its
packs are ``pack_unavailable`` (``unavailable`` asks before the gateway decides a call).

All of this lives on one event loop per process (``runtime.py``): MCP sessions are bound
to the loop that opened them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import mcp_types as types
from django.conf import settings
from mcp import ClientSession, StdioServerParameters, stdio_client

from capabilities.manifest import Pack, PackSet, load_packs
from capabilities.mcp_host import limits as pack_limits
from capabilities.mcp_host.limits import CODES, PACK_UNAVAILABLE, HostGuard, PackLimits
from capabilities.mcp_host.sandbox import PlatformPaths, SandboxUnavailable, grant_for, host_parameters
from yimi_project import call_capability
from yimi_project.logs import log_event


@dataclass
class ToolResult:
    structured: Any
    is_error: bool
    text: str
    transport_error: str | None = None
    limit: str | None = None  # the limit (limits.NAMES) the call ran into, as its host said or the platform found
    cpu_seconds: float | None = None  # the host's CPU time after the call, as it said


class PackUnavailable(Exception):
    """A pack's host could not start (or is not tried again yet)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class StartFailure:
    at: float  # the manager's clock
    source: tuple[str, ...]
    reason: str


class HostProcess:
    """One host process and its MCP session, owned by a single task."""

    def __init__(
        self, key: str, params: StdioServerParameters, idle_timeout: float, on_changed: Callable[[str], None], errlog: Any,
        source: tuple[str, ...] = (), guard: HostGuard | None = None,
    ) -> None:
        self.key, self.params, self.idle_timeout, self.errlog = key, params, idle_timeout, errlog
        self.source = source  # the directories of the pack versions it serves
        self.guard = guard  # its limits: cgroup and exit status (limits.py)
        self.session: ClientSession | None = None
        self.tools: dict[str, types.Tool] = {}
        self.last_used = time.monotonic()
        self.error: BaseException | None = None
        self.lost = False  # its session broke: the process is gone
        self.in_flight = 0
        self.retiring = False  # replaced before its next call, once no call runs on it
        self.reported_limit: str | None = None
        self.ended_by: str | None = None  # the limit that ended it (limits.HostGuard.diagnose), once stopped
        self.exit_code: int | None = None  # its exit status, once stopped, if it ended by itself
        self._finished = False
        self._on_changed = on_changed
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self, timeout: float = 20.0) -> None:
        # A context of its own: the host outlives the run that started it (whose context,
        # database thread included, ends with the run: brain.worker.in_own_context).
        self._task = asyncio.get_running_loop().create_task(self._serve(), context=contextvars.Context())
        await asyncio.wait_for(self._ready.wait(), timeout)
        if self.session is None:
            raise RuntimeError(f"pack host {self.key} did not start: {self.error!r}")
        cgroup = self.guard.cgroup.version if self.guard is not None and self.guard.cgroup is not None else "none"
        log_event("pack_host_started", host=self.key, tools=len(self.tools), cgroup=cgroup)

    @property
    def alive(self) -> bool:
        return self.session is not None and not self.lost and self._task is not None and not self._task.done()

    @property
    def limits(self) -> PackLimits | None:
        return self.guard.limits if self.guard is not None else None

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
        if self.session is None or self.lost:
            return ToolResult(None, True, "", transport_error="DISCONNECTED: the pack host is not running")
        meta: Any = {call_capability.META_KEY: capability} if capability else None
        self.in_flight += 1
        try:
            result = await asyncio.wait_for(self.session.call_tool(name, arguments, meta=meta), timeout)
        except TimeoutError:
            return ToolResult(None, True, "", transport_error=f"TIMEOUT: no result within {timeout:g} s")
        except Exception as exc:  # noqa: BLE001 - the host died or the session broke
            self.lost = True
            return ToolResult(None, True, "", transport_error=f"DISCONNECTED: {type(exc).__name__}")
        finally:
            self.in_flight -= 1
            self.last_used = time.monotonic()
        text = " ".join(c.text for c in result.content if isinstance(c, types.TextContent))
        said = result.meta or {}
        limit = said.get(pack_limits.META_LIMIT) if result.is_error else None
        cpu = said.get(pack_limits.META_CPU)
        return ToolResult(
            result.structured_content, bool(result.is_error), text, limit=limit if limit in pack_limits.NAMES else None,
            cpu_seconds=float(cpu) if isinstance(cpu, (int, float)) and not isinstance(cpu, bool) else None,
        )

    async def stop(self) -> None:
        """Stop the process (it has exited when this returns), then read what ended it and
        release its cgroup and status file; safe to call more than once."""
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        if self._finished:
            return
        self._finished = True
        if self.guard is not None:
            self.exit_code = self.guard.exit_status()[0]
            self.ended_by = self.guard.diagnose(self.reported_limit)
            if self.ended_by is not None:
                log_event("pack_limit_reached", host=self.key, code=CODES[self.ended_by])
            await asyncio.to_thread(self.guard.release)  # kills what is left in its cgroup
        if self.errlog is not sys.__stderr__ and hasattr(self.errlog, "close"):
            self.errlog.close()
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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.packs_dir = Path(packs_dir)
        self.clock = clock  # when a failed start may be tried again
        self.log_dir = log_dir
        paths = paths or PlatformPaths.from_settings()
        # the packs directly in its packs directory are the shipped ones (secret grants name the origin)
        self.paths = paths if paths.packs_dir is not None else replace(paths, packs_dir=self.packs_dir)
        self.fake = fake
        self.watch_interval = watch_interval
        self.hosts: dict[str, HostProcess] = {}
        self.tools_version = 0
        self._on_tools_changed = on_tools_changed
        self._lock = asyncio.Lock()  # reclaiming and closing
        self._starting: dict[str, asyncio.Lock] = {}  # per host: one start at a time
        self.failed: dict[str, StartFailure] = {}  # hosts that could not start, until retried

    def packs(self) -> PackSet:
        return load_packs(self.packs_dir)

    def host_key(self, pack: Pack) -> str:
        shipped = pack.path.parent.resolve() == self.packs_dir.resolve()
        return "shared" if pack.host == "shared" and shipped else pack.name

    def _source(self, key: str) -> tuple[str, ...]:
        return tuple(sorted(str(p.path) for p in self.packs().packs.values() if self.host_key(p) == key))

    def _packs_of(self, key: str) -> list[Pack]:
        return [p for p in self.packs().packs.values() if self.host_key(p) == key]

    def _params(self, key: str, limits: PackLimits) -> StdioServerParameters:
        """The sandboxed command for one host: only what its packs declared (sandbox.py),
        under its limits (the host sets its rlimits first thing). A published version's
        host reads the registry's directory of that version."""
        packs = self._packs_of(key)
        packs_dir = packs[0].path.parent.resolve() if key != "shared" and packs else self.packs_dir.resolve()
        args = ["-m", "capabilities.mcp_host.host", "--packs-dir", str(packs_dir), "--select", key,
                "--watch-interval", str(self.watch_interval), *pack_limits.host_arguments(limits)]
        if self.fake:
            args.append("--fake")
        return host_parameters(args, grant_for(packs, self.paths), readable=[packs_dir], tmp_bytes=limits.memory_mib * pack_limits.MiB)

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
        different packs start at the same time (each takes seconds in its sandbox). A host
        whose process is gone, or that is retiring and idle, is replaced; one that could
        not start raises ``PackUnavailable`` until ``YIMI_PACK_HOST_RETRY_SECONDS`` passed
        (or its packs changed)."""
        async with self._starting.setdefault(key, asyncio.Lock()):
            current = self.hosts.get(key)
            source = self._source(key)
            if current is not None and current.alive and current.source == source and not (current.retiring and current.in_flight == 0):
                return current
            failed = self.failed.get(key)
            if failed is not None and failed.source == source and self.clock() - failed.at < settings.YIMI_PACK_HOST_RETRY_SECONDS:
                raise PackUnavailable(failed.reason)
            replaced = current is not None and current.alive and current.source != source
            if current is not None:
                del self.hosts[key]
                await current.stop()  # another version of the pack, a dead process, or retiring
            process = await self._start(key, source)
            self.hosts[key] = process
            if replaced:
                self._changed(key)
            return process

    async def _start(self, key: str, source: tuple[str, ...]) -> HostProcess:
        guard: HostGuard | None = None
        try:
            limits = pack_limits.for_packs(self._packs_of(key))
            params = self._params(key, limits)
            guard = HostGuard.make(key, limits, cgroups=settings.YIMI_PACK_CGROUPS)
            params = guard.wrap(params)
        except Exception as exc:  # noqa: BLE001 - no bubblewrap, a bad setting: nothing started
            if guard is not None:
                guard.release()
            if not isinstance(exc, SandboxUnavailable):
                log_event("pack_host_unprepared", host=key, error=f"{type(exc).__name__}: {exc}"[:300])
            reason = str(exc) if isinstance(exc, SandboxUnavailable) else f"its host could not be prepared ({type(exc).__name__})"
            raise self._failed(key, source, reason) from None
        process = HostProcess(key, params, self._idle_timeout(key), self._changed, self._errlog(key), source, guard)
        try:
            await process.start()
        except Exception as exc:  # noqa: BLE001 - why is told to the caller and logged
            await process.stop()
            raise self._failed(key, source, self._why_not_started(process, exc)) from None
        self.failed.pop(key, None)
        return process

    def _failed(self, key: str, source: tuple[str, ...], reason: str) -> PackUnavailable:
        self.failed[key] = StartFailure(self.clock(), source, reason)
        log_event("pack_host_failed", host=key, reason=reason)
        return PackUnavailable(reason)

    @staticmethod
    def _why_not_started(process: HostProcess, exc: BaseException) -> str:
        """Why a host did not start, in words fit for a caller (no paths, no traceback: its
        stderr log has those)."""
        if process.ended_by is not None and process.limits is not None:
            return f"its host did not start: {process.limits.describe(process.ended_by)}"
        if process.exit_code is not None:
            return f"its host did not start (it exited with status {process.exit_code})"
        if isinstance(exc, TimeoutError):
            return "its host did not start (no answer within 20 s)"
        return f"its host did not start ({type(exc).__name__})"

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
        for host in await asyncio.gather(*(self.host(key) for key in keys), return_exceptions=True):
            if isinstance(host, PackUnavailable):
                continue  # its packs offer no tools until their host starts (logged as pack_host_failed)
            if isinstance(host, BaseException):
                raise host
            host.last_used = time.monotonic()
            tools.update({n: t for n, t in host.tools.items() if n.split("__", 1)[0] in pack_names})
        return tools

    async def unavailable(self, full_name: str) -> str | None:
        """Why a call of ``full_name`` cannot run now — its host could not start (or is not
        tried again yet), or does not serve the tool — or None when it can. Asked before the
        gateway decides the call, so such a call is refused (``pack_unavailable``) instead of
        recorded as executing and ending ``unknown``; a host not running is started now, as
        the call would. An unknown pack or tool is None: the gateway says so itself."""
        pack = self.packs().packs.get(full_name.split("__", 1)[0])
        if pack is None or pack.tools.get(full_name.split("__", 1)[1]) is None:
            return None
        try:
            host = await self.host(self.host_key(pack))
        except PackUnavailable as exc:
            return exc.reason
        return None if await self._serves(host, full_name) else f"its host does not serve {full_name}"

    @staticmethod
    async def _serves(host: HostProcess, full_name: str) -> bool:
        if full_name not in host.tools:
            with contextlib.suppress(Exception):  # a listing from a host that changed since
                await host.refresh_tools()
        return full_name in host.tools

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
        except PackUnavailable as exc:  # nothing ran: the receipt says so (receipts.normalize)
            return ToolResult(None, True, "", transport_error=f"{PACK_UNAVAILABLE}: {exc.reason}")
        if not await self._serves(host, full_name):
            return ToolResult(None, True, "", transport_error=f"{PACK_UNAVAILABLE}: its host does not serve {full_name}")
        return await self._settle(host, await host.call(full_name, arguments, timeout, capability))

    async def _settle(self, host: HostProcess, result: ToolResult) -> ToolResult:
        """After a call: a host that reached a limit (it died of one, or said a handler
        failed for lack of one, or its cgroup shows one when the call timed out) or that lost
        its process is stopped, and a call it ended carries the limit's code; a host whose
        cgroup shows a limit reached meanwhile, or that used half its CPU time, retires."""
        if result.limit is not None:
            host.reported_limit = result.limit
        timed_out = (result.transport_error or "").startswith("TIMEOUT")
        evidence = host.guard.evidence() if host.guard is not None else None
        if result.limit is not None or host.lost or (timed_out and evidence is not None):
            await self._forget(host)
            if host.ended_by is not None and host.limits is not None:
                code = CODES[host.ended_by]
                stopped = f"{code}: the pack's host was stopped: {host.limits.describe(host.ended_by)}"
                return ToolResult(None, True, result.text, transport_error=stopped, limit=host.ended_by)
            return result
        used = result.cpu_seconds or 0.0
        if evidence is not None or (host.limits is not None and used >= pack_limits.RETIRE_AT * host.limits.cpu_seconds):
            host.retiring = True
        return result

    async def _forget(self, host: HostProcess) -> None:
        """Stop ``host`` and take it out of service (the next use starts another)."""
        async with self._starting.setdefault(host.key, asyncio.Lock()):
            if self.hosts.get(host.key) is host:
                del self.hosts[host.key]
        await host.stop()

    async def reclaim_idle(self, now: float | None = None) -> list[str]:
        """Stop hosts idle for their timeout or longer at ``now`` (``time.monotonic()``, which
        stamps ``last_used``, unless a test gives one); returns the stopped keys."""
        now = time.monotonic() if now is None else now
        stopped = []
        async with self._lock:
            for key, host in list(self.hosts.items()):
                if not host.alive or (host.in_flight == 0 and now - host.last_used >= host.idle_timeout):
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
