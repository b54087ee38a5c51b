"""The trace of one utterance: when each stage of its way happened, kept on its run.

``Run.trace`` is a small JSON object ``{stage: epoch milliseconds}`` (wall clock, two
decimals, so stages measured in different processes — daphne and a Celery worker —
line up). The stages, in order (``STAGES``):

``received`` the text frame reached the consumer; ``admitted`` the device re-checked and
admission decided (the stamp travels in the run's INSERT, so it is taken before the one
statement that writes the admission, the utterance and the run); ``queued`` those rows are
written and the run was handed to its executor (``brain.dispatch.dispatch_run``); ``claimed`` a worker took it;
``prompt_built`` the history is read and the messages built; ``memory_prepared`` the
core profile and memory blocks are added; ``brain_request`` the request to the brain
leaves; ``first_token`` the first text delta came back; ``first_chunk`` the first checked
``reply.chunk`` was handed to the channel layer; ``stored`` the reply is in the timeline;
``done_sent`` the consumer wrote ``reply.done`` on the origin device's socket; ``ack`` the
device acknowledged it.

Writing it must not slow the path it measures: the stages up to ``stored`` are kept in
memory (the receive time travels with the frame into admission, ``queued`` travels with
the task message) and written with the run's INSERT and the UPDATE that closes the run;
``done_sent`` and ``ack`` are written together, by one UPDATE, when the device ACKs
(``brain.services.trace_stages_update``, inside the ACK's statement). This module needs no database (the benchmark
reads its ``STAGES`` and ``stage_durations``). A
stage that never happened (a delegation-only reply has no first token; a device that
never ACKs) is absent, and shown as missing, never as zero.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.template.loader import render_to_string

if TYPE_CHECKING:
    from brain.models import Run

STAGES: tuple[str, ...] = (
    "received",
    "admitted",
    "queued",
    "claimed",
    "prompt_built",
    "memory_prepared",
    "brain_request",
    "first_token",
    "first_chunk",
    "stored",
    "done_sent",
    "ack",
)

LABELS = {
    "received": "frame received",
    "admitted": "device re-check and admission",
    "queued": "timeline write and run queued",
    "claimed": "run claimed",
    "prompt_built": "prompt built",
    "memory_prepared": "memory prepared",
    "brain_request": "brain request sent",
    "first_token": "first token",
    "first_chunk": "first chunk sent",
    "stored": "reply stored",
    "done_sent": "reply.done sent",
    "ack": "ACK",
}


def now_ms() -> float:
    """The time of a stage: wall-clock epoch milliseconds, to 0.01 ms."""
    return round(time.time() * 1000, 2)


def mark(run: Run, stage: str, at: float | None = None) -> None:
    """Note ``stage`` on the run in memory (the first time only); written with the
    run's next write (``brain.services.finish_run``)."""
    if run.trace is None:
        run.trace = {}
    run.trace.setdefault(stage, now_ms() if at is None else at)


@dataclass(frozen=True)
class Segment:
    """One stage on the bar: the time from the stage before it that happened."""

    stage: str
    label: str
    at_ms: float | None  # since ``received`` (or the first stage recorded); None: missing
    duration_ms: float | None  # since the previous recorded stage; None: missing
    after: str  # the previous recorded stage (the segment's start)
    percent: float  # of the bar's width


def segments(trace: dict[str, Any] | None) -> list[Segment]:
    """The stages of ``trace`` in order, each with its time since the trace began and
    since the previous recorded stage; missing stages carry None (and no width). Values
    that are not numbers count as missing."""
    times = {s: float(v) for s, v in (trace or {}).items() if s in STAGES and isinstance(v, int | float) and not isinstance(v, bool)}
    if not times:
        return [Segment(s, LABELS[s], None, None, "", 0.0) for s in STAGES]
    start = times.get("received", min(times.values()))
    total = max(max(times.values()) - start, 0.0)
    out: list[Segment] = []
    previous: tuple[str, float] | None = None
    for stage in STAGES:
        at = times.get(stage)
        if at is None:
            out.append(Segment(stage, LABELS[stage], None, None, previous[0] if previous else "", 0.0))
            continue
        duration = max(at - previous[1], 0.0) if previous else 0.0
        percent = (duration / total * 100) if total > 0 else 0.0
        out.append(Segment(stage, LABELS[stage], at - start, duration, previous[0] if previous else "", percent))
        previous = (stage, at)
    return out


def stage_durations(trace: dict[str, Any] | None) -> dict[str, float]:
    """For the benchmark: each recorded stage's time since the previous recorded stage
    (ms), plus ``total`` (first to last stage). Missing stages are left out."""
    segs = [s for s in segments(trace) if s.duration_ms is not None]
    out = {s.stage: s.duration_ms for s in segs[1:] if s.duration_ms is not None}
    if segs:
        out["total"] = max(s.at_ms or 0.0 for s in segs)
    return out


def render_bar(trace: dict[str, Any] | None) -> str:
    """The trace as server-rendered HTML (``brain/trace_bar.html``): one horizontal bar,
    a segment per recorded stage as wide as its share of the whole, with its ms; below it
    every stage in order, missing ones marked missing."""
    segs = segments(trace)
    recorded = [s for s in segs if s.at_ms is not None]
    rows = [
        {**s.__dict__, "hue": round(STAGES.index(s.stage) * 360 / len(STAGES)), "percent_css": f"{s.percent:.3f}"}
        for s in segs
    ]
    context = {
        "total_ms": max(s.at_ms or 0.0 for s in recorded) if recorded else None,
        "stages": rows,
        "bar": [r for r in rows if r["at_ms"] is not None and r["after"]],
    }
    return render_to_string("brain/trace_bar.html", context)
