"""One pack-host event loop per process, on a background thread.

Celery runs each task in its own ``asyncio.run`` loop and daphne has its own; MCP
sessions must outlive both, so they live on this loop. Callers on any loop use
``await on_host_loop(lambda m: m.call(...))``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from django.conf import settings

if TYPE_CHECKING:
    from capabilities.mcp_host.manager import HostManager

T = TypeVar("T")
_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_manager: HostManager | None = None


def _start() -> tuple[asyncio.AbstractEventLoop, HostManager]:
    global _loop, _manager
    with _lock:
        if _loop is None or _manager is None:
            # Imported here, not at the top: the MCP SDK costs about a second of every
            # process's start (web, worker, manage.py), and most never start a pack host.
            from capabilities.mcp_host.manager import HostManager

            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="pack-hosts", daemon=True).start()
            manager = HostManager(settings.YIMI_PACKS_DIR, fake=settings.YIMI_PACKS_FAKE, log_dir=settings.DATA_DIR / "logs")
            asyncio.run_coroutine_threadsafe(manager.reclaim_forever(), loop)
            _loop, _manager = loop, manager
        return _loop, _manager


async def on_host_loop(work: Callable[[HostManager], Awaitable[T]]) -> T:
    loop, manager = _start()
    future = asyncio.run_coroutine_threadsafe(work(manager), loop)
    return await asyncio.wrap_future(future)


def refresh_pack_if_running(name: str, timeout: float = 120.0) -> list[str] | None:
    """After the pack registry switched ``name`` (published, reverted, turned on or off):
    if this process runs pack hosts, restart or stop that pack's host and announce the new
    tool list (``HostManager.refresh_pack``); returns the tools served, or None when this
    process runs no hosts (a management command): their processes see the change at
    their next ``load_packs()``."""
    with _lock:
        loop, manager = _loop, _manager
    if loop is None or manager is None:
        return None
    return asyncio.run_coroutine_threadsafe(manager.refresh_pack(name), loop).result(timeout)


def reset_for_tests() -> None:
    """Stop every host and the loop (tests change the packs directory between tests)."""
    global _loop, _manager
    with _lock:
        if _loop is not None and _manager is not None:
            asyncio.run_coroutine_threadsafe(_shutdown(_manager), _loop).result(30)
            _loop.call_soon_threadsafe(_loop.stop)
        _loop, _manager = None, None


async def _shutdown(manager: HostManager) -> None:
    await manager.close()
    current = asyncio.current_task()
    others = [t for t in asyncio.all_tasks() if t is not current]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)
