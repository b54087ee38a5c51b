"""Call events for the companion report (issue 21, "Observability"): start, snapshot built
(or failed), first audio played as the device reports it (``played``), reconnect,
barge-in and end, keyed by call.

Recording never waits for the database: ``record`` appends to this process's buffer under
a lock and returns; a writer thread stores the buffer in one ``bulk_create`` every
``FLUSH_SECONDS`` (or sooner when ``FLUSH_EVENTS`` are waiting). The time of an event is
taken when it is recorded, so a late write changes nothing in the report. The buffer is
bounded: beyond ``MAX_PENDING`` the oldest events are dropped and counted in the log
(the report is for trends; the audio path comes first). The only writer of ``CallEvent``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import close_old_connections, connection
from django.utils import timezone

from companion.models import CallEvent, CallSummary
from yimi_project.logs import log_event

FLUSH_SECONDS = 0.5
FLUSH_EVENTS = 50
MAX_PENDING = 5000
KINDS = set(CallEvent.Kind.values)


@dataclass(frozen=True)
class Pending:
    call_pk: int
    owner_id: int
    kind: str
    at: datetime
    data: dict[str, Any]


class EventBuffer:
    """Buffered, off-path writes of call events (module docstring). ``background``: start
    the writer thread on the first event (off: only ``flush`` writes, e.g. in a test that
    holds its data in one transaction)."""

    def __init__(self, *, clock: Callable[[], datetime] = timezone.now, background: bool = True) -> None:
        self.clock = clock
        self.background = background
        self._pending: deque[Pending] = deque()
        self._lock = threading.Lock()
        self._writing = threading.Lock()  # one write at a time: a flush waits for the thread's
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.dropped = 0

    def record(self, call_pk: int, owner_id: int, kind: str, **data: Any) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown call event kind {kind!r}")
        event = Pending(call_pk, owner_id, kind, self.clock(), data)
        with self._lock:
            self._pending.append(event)
            while len(self._pending) > MAX_PENDING:
                self._pending.popleft()
                self.dropped += 1
            many = len(self._pending) >= FLUSH_EVENTS
            if self.background and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._run, name="yimi-call-events", daemon=True)
                self._thread.start()
        if many:
            self._wake.set()

    def flush(self) -> int:
        """Write what is waiting, in one statement; returns how many events were written.
        Waits for a write already under way (so afterwards every event recorded before the
        call is stored). A failed write is logged and its events are dropped (never retried
        into a loop)."""
        with self._writing:
            with self._lock:
                batch = list(self._pending)
                self._pending.clear()
            if not batch:
                return 0
            try:
                CallEvent.objects.bulk_create(
                    [CallEvent(call_id=e.call_pk, owner_id=e.owner_id, kind=e.kind, at=e.at, data=e.data) for e in batch]
                )
            except Exception as exc:  # noqa: BLE001 - observability never breaks a call
                log_event("call_events_lost", events=len(batch), error=type(exc).__name__)
                return 0
            return len(batch)

    def _run(self) -> None:
        while True:
            self._wake.wait(FLUSH_SECONDS)
            self._wake.clear()
            close_old_connections()
            try:
                self.flush()
            finally:
                connection.close()  # this thread's connection goes back between batches
            if self.dropped:
                log_event("call_events_dropped", events=self.dropped)
                self.dropped = 0


buffer = EventBuffer()


def record(call: Any, kind: str, **data: Any) -> None:
    """Note one event of ``call`` (a ``VoiceCall``) now; returns at once."""
    buffer.record(call.pk, call.owner_id, kind, **data)


def flush() -> int:
    return buffer.flush()


# --- the report ------------------------------------------------------------------------------------


def percentile(samples: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..1); None without samples."""
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


@dataclass
class OwnerReport:
    owner_id: int
    calls: int = 0
    first_audio_ms: list[float] | None = None
    snapshot_failures: int = 0
    reconnects: int = 0
    barge_ins: int = 0
    repeated_questions: int = 0
    short_reply_loops: int = 0
    refused_raised: int = 0

    def row(self) -> dict[str, Any]:
        lat = self.first_audio_ms or []
        p50, p95 = percentile(lat, 0.5), percentile(lat, 0.95)
        return {
            "owner": self.owner_id, "calls": self.calls, "first_audio_n": len(lat),
            "first_audio_p50_ms": round(p50) if p50 is not None else None, "first_audio_p95_ms": round(p95) if p95 is not None else None,
            "snapshot_failures": self.snapshot_failures, "reconnects": self.reconnects, "barge_ins": self.barge_ins,
            "repeated_questions": self.repeated_questions, "short_reply_loops": self.short_reply_loops,
            "refused_raised": self.refused_raised,
        }


def report(*, since: datetime | None = None, owner_id: int | None = None) -> list[dict[str, Any]]:
    """Per owner: calls started, first-audio latency (call start → the first ``played`` of
    the call) p50/p95, snapshot failures, reconnects, barge-ins, and from the calls' valid
    summaries the repeated questions, short-reply loops and refused topics Yimi raised."""
    events = CallEvent.objects.all()
    summaries = CallSummary.objects.filter(invalidated_at=None)
    if since is not None:
        events, summaries = events.filter(at__gte=since), summaries.filter(created_at__gte=since)
    if owner_id is not None:
        events, summaries = events.filter(owner_id=owner_id), summaries.filter(owner_id=owner_id)
    owners: dict[int, OwnerReport] = {}
    starts: dict[int, datetime] = {}
    first: dict[int, datetime] = {}
    for call_pk, owner, kind, at in events.order_by("at", "id").values_list("call_id", "owner_id", "kind", "at").iterator():
        r = owners.setdefault(owner, OwnerReport(owner, first_audio_ms=[]))
        if kind == CallEvent.Kind.START:
            r.calls += 1
            starts.setdefault(call_pk, at)
        elif kind == CallEvent.Kind.FIRST_AUDIO:
            first.setdefault(call_pk, at)
        elif kind == CallEvent.Kind.SNAPSHOT_FAILED:
            r.snapshot_failures += 1
        elif kind == CallEvent.Kind.RECONNECT:
            r.reconnects += 1
        elif kind == CallEvent.Kind.BARGE_IN:
            r.barge_ins += 1
    call_owner = dict(CallEvent.objects.filter(call_id__in=list(first), kind=CallEvent.Kind.START).values_list("call_id", "owner_id"))
    for call_pk, played in first.items():
        started = starts.get(call_pk)
        if started is not None and played >= started and call_pk in call_owner:
            owners[call_owner[call_pk]].first_audio_ms.append((played - started).total_seconds() * 1000)  # type: ignore[union-attr]
    for owner, stats in summaries.values_list("owner_id", "stats"):
        r = owners.setdefault(owner, OwnerReport(owner, first_audio_ms=[]))
        r.repeated_questions += int((stats or {}).get("repeated_questions") or 0)
        r.short_reply_loops += int((stats or {}).get("short_reply_loops") or 0)
        r.refused_raised += int((stats or {}).get("refused_raised") or 0)
    return [owners[k].row() for k in sorted(owners)]
