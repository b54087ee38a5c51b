"""The call short context (flow F7): what a voice call starts with.

Six sources — profile, notes, assertions, recent timeline, time zone, health — are read
in parallel, each in its own thread and each given at most 1,200 ms; a source that has
not answered by then (or failed) is left out, and the others are used. The sections are
joined in a fixed priority order and cut so the whole text is at most 2,400 characters.

A source is a plain function ``(owner_id) -> str``; callers (and tests) may pass their
own list. Each runs with its own database connection, closed when it finishes. A source
that overruns keeps its thread until it returns, but the caller never waits for it.
Each source's time runs out when ``wait_source_deadline`` returns: the one clock of the
short context, which tests replace to say themselves when a source's time is up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.db import connections

from accounts.models import User
from memory.assertions import projections
from memory.assertions import store as assertions
from memory.personal import ambient, health
from memory.timeline.models import TimelineEntry
from yimi_project.logs import log_event

SOURCE_TIMEOUT_SECONDS = 1.2
TOTAL_CHARS = 2400
RECENT_ENTRIES = 12
SourceFn = Callable[[int], str]
# Our own pool, not the event loop's default executor: ``asyncio.run`` waits for the
# default executor's threads on exit, which would make a caller wait for a slow source.
_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="short-context")


def profile_source(owner_id: int) -> str:
    return projections.body(projections.core_profile(owner_id).user)


def notes_source(owner_id: int) -> str:
    return projections.body(projections.core_profile(owner_id).memory)


def assertions_source(owner_id: int) -> str:
    rows = assertions.query(
        owner_id, exclude_predicates=(assertions.CORE_PROFILE, assertions.SPEAKING_PREFERENCES), limit=20
    )
    return "\n".join(
        f"- {r['predicate']}: {assertions.payload_text(r['payload'])}" + (" (needs re-evaluation)" if r["needs_reevaluation"] else "")
        for r in rows
    )


def timeline_source(owner_id: int) -> str:
    rows = list(
        TimelineEntry.objects.filter(owner_id=owner_id, kind__in=["utterance", "reply"], scope__in=["owner", ""])
        .order_by("-seq")
        .values_list("kind", "text")[:RECENT_ENTRIES]
    )
    said = "\n".join(f"{'Yimi' if kind == 'reply' else 'Owner'}: {' '.join(text.split())[:200]}" for kind, text in reversed(rows))
    # Then what was overheard in the last 600 s, marked as such (memory.personal.ambient): still six sources.
    overheard = ambient.recent(owner_id).text
    return f"{said}\n{overheard}" if said and overheard else said or overheard


def time_zone_source(owner_id: int) -> str:
    name = User.objects.filter(id=owner_id).values_list("time_zone", flat=True).first() or "UTC"
    try:
        zone = ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        name, zone = "UTC", ZoneInfo("UTC")
    return f"{name}, local time {datetime.now(zone).strftime('%Y-%m-%d %H:%M %a')}"


def health_source(owner_id: int) -> str:
    """The stored health records (``memory.personal.health``: the latest daily summary and today's
    activities, at most 600 characters), then health facts the owner confirmed as L3
    assertions with predicates ``health.*``."""
    records = health.short_context(owner_id)
    rows = assertions.query(owner_id, prefix="health.", limit=10)
    facts = "\n".join(f"- {r['predicate'][7:]}: {assertions.payload_text(r['payload'])}" for r in rows)
    return f"{records}\n{facts}" if records and facts else records or facts


# Priority order: what is kept first when the 2,400 characters run out.
SOURCES: tuple[tuple[str, SourceFn], ...] = (
    ("time_zone", time_zone_source),
    ("profile", profile_source),
    ("health", health_source),
    ("assertions", assertions_source),
    ("notes", notes_source),
    ("recent_timeline", timeline_source),
)


@dataclass
class ShortContext:
    text: str
    included: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    elapsed_ms: int = 0

    def payload(self) -> dict[str, object]:
        return {
            "text": self.text,
            "chars": len(self.text),
            "included": self.included,
            "timed_out": self.timed_out,
            "failed": self.failed,
            "elapsed_ms": self.elapsed_ms,
        }


def _in_thread(fn: SourceFn, owner_id: int) -> str:
    try:
        return fn(owner_id)
    finally:
        connections.close_all()  # this thread's connections only


async def wait_source_deadline(name: str, seconds: float) -> None:
    """Waits out the time source ``name`` has to answer (``seconds``, 1.2 by default)."""
    await asyncio.sleep(seconds)


async def _read(name: str, fn: SourceFn, owner_id: int, timeout: float) -> tuple[str, str | None, str]:
    """One source: its answer if it came before its deadline passed, else ``timed_out``."""
    loop = asyncio.get_running_loop()
    answer = loop.run_in_executor(_POOL, _in_thread, fn, owner_id)
    deadline = asyncio.ensure_future(wait_source_deadline(name, timeout))
    either: set[asyncio.Future[Any]] = {answer, deadline}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        deadline.cancel()
    if not answer.done():
        answer.cancel()  # as wait_for would: the thread runs on, nobody waits for it
        return name, None, "timed_out"
    try:
        text = answer.result()
    except Exception as exc:
        log_event("short_context_source_failed", source=name, error=type(exc).__name__)
        return name, None, "failed"
    return name, text, "ok"


async def acall_short_context(
    owner_id: int,
    *,
    sources: Sequence[tuple[str, SourceFn]] = SOURCES,
    timeout: float = SOURCE_TIMEOUT_SECONDS,
    total_chars: int = TOTAL_CHARS,
) -> ShortContext:
    """Read every source in parallel (each ≤ ``timeout``) and assemble ≤ ``total_chars``."""
    started = time.monotonic()
    results = await asyncio.gather(*(_read(name, fn, owner_id, timeout) for name, fn in sources))
    context = ShortContext(text="")
    parts: list[str] = []
    for name, text, status in results:
        if status != "ok":
            (context.timed_out if status == "timed_out" else context.failed).append(name)
            continue
        body = (text or "").strip()
        if not body:
            continue
        section = f"[{name}]\n{body}"
        room = total_chars - len("\n".join(parts)) - (1 if parts else 0)
        if room < len(name) + 4:  # not even a header and one character fit
            continue
        if len(section) > room:
            section = section[: room - 1] + "…"
        parts.append(section)
        context.included.append(name)
    context.text = "\n".join(parts)
    context.elapsed_ms = int((time.monotonic() - started) * 1000)
    if context.timed_out:
        log_event("short_context_sources_timed_out", sources=",".join(context.timed_out))
    return context


def call_short_context(owner_id: int, **kwargs: object) -> ShortContext:
    """Synchronous entry point (management commands, DRF views)."""
    return asyncio.run(acall_short_context(owner_id, **kwargs))  # type: ignore[arg-type]
