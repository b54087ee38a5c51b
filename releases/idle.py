"""Waiting for idle before a switch (flows F5 and F6).

A switch stops every service, so it waits until nothing would be cut off. Each condition
has a name and answers with what blocks it, or nothing:

- ``call``: a voice call not hung up (``accounts.VoiceCall`` without ``ended_at``);
- ``run``: an agent run queued or running (``brain.Run``);
- ``delegation``: a sub-agent's task queued or running (``brain.AgentTask``: background
  delegation);
- ``session_write_lease``: a session holding one of the owner write locks now — memory,
  gateway calls or payments (``memory.locks``; PostgreSQL advisory locks seen in
  ``pg_locks``; on SQLite every such write is one ``BEGIN IMMEDIATE`` transaction, nothing
  held between requests to see);
- ``phone_task``: a phone errand whose ``running`` marker is there
  (``<data dir>/packs/phone/tasks/<task>/running``, the phone pack's own record);
- ``fault_log``: a log line matching a fault rule in the last 5 minutes of the logs
  (``YIMI_RELEASE_FAULT_LOGS``: JSON-lines files, ``YIMI_LOG_FORMAT=json``; a rule matches
  the level ``error``/``critical`` or an event name in ``YIMI_RELEASE_FAULT_EVENTS``);
- ``out_of_memory``: an out-of-memory kill counted by a memory cgroup
  (``YIMI_RELEASE_OOM_FILES``: cgroup v1 ``memory.oom_control`` or v2 ``memory.events``;
  ``oom_kill`` above the count acknowledged in ``<releases root>/oom-baseline.json``, which a
  successful switch rewrites).

``blockers()`` answers every condition (so an operator sees them all at once);
``wait_for_idle`` polls until none blocks, with an injected clock and sleep.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from accounts.models import VoiceCall
from brain.models import AgentTask, Run
from memory.locks import CALLS_LOCK_SPACE, MEMORY_LOCK_SPACE, PAYMENTS_LOCK_SPACE
from releases.pointers import releases_root
from yimi_project.errors import YimiError

FAULT_WINDOW_SECONDS = 300.0  # "no fault-rule hit in the last 5 minutes of logs"
FAULT_LEVELS = frozenset({"error", "critical"})
OOM_BASELINE_FILE = "oom-baseline.json"


@dataclass(frozen=True)
class Blocker:
    condition: str
    detail: str

    def __str__(self) -> str:
        return f"{self.condition}: {self.detail}"


def _call() -> Blocker | None:
    open_calls = VoiceCall.objects.filter(ended_at__isnull=True).count()
    return Blocker("call", f"{open_calls} call(s) not hung up") if open_calls else None


def _run() -> Blocker | None:
    n = Run.objects.filter(state__in=[Run.State.QUEUED, Run.State.RUNNING]).count()
    return Blocker("run", f"{n} run(s) queued or running") if n else None


def _delegation() -> Blocker | None:
    n = AgentTask.objects.filter(state__in=[AgentTask.State.QUEUED, AgentTask.State.RUNNING]).count()
    return Blocker("delegation", f"{n} delegated task(s) queued or running") if n else None


def _session_write_lease() -> Blocker | None:
    if connection.vendor != "postgresql":  # by nature: only PostgreSQL holds the write locks as advisory locks (memory/locks.py)
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND classid = ANY(%s) "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND pid <> pg_backend_pid()",
            [[MEMORY_LOCK_SPACE, CALLS_LOCK_SPACE, PAYMENTS_LOCK_SPACE]],
        )
        held = cursor.fetchone()[0]
    return Blocker("session_write_lease", f"{held} owner write lock(s) held") if held else None


def _phone_task(data_dir: Path) -> Blocker | None:
    running = sorted(p.parent.name for p in (data_dir / "packs" / "phone" / "tasks").glob("*/running"))
    return Blocker("phone_task", f"{len(running)} phone task(s) running ({', '.join(running[:3])})") if running else None


def fault_hits(lines: Iterable[str], now: float, *, events: frozenset[str] = frozenset(), window: float = FAULT_WINDOW_SECONDS) -> list[str]:
    """The events of JSON log lines within ``window`` seconds before ``now`` that a fault
    rule matches (level error/critical, or an event named in ``events``)."""
    hits = []
    for line in lines:
        try:
            row = json.loads(line)
            ts = float(row["ts"])
        except (ValueError, KeyError, TypeError):
            continue  # not a JSON log line
        if not isinstance(row, dict) or not now - window <= ts <= now:
            continue
        if str(row.get("level", "")).lower() in FAULT_LEVELS or str(row.get("event", "")) in events:
            hits.append(str(row.get("event", "?")))
    return hits


def _fault_log(files: Sequence[Path], now: float, events: frozenset[str]) -> Blocker | None:
    hits: list[str] = []
    for path in files:
        if path.is_file():
            with open(path, encoding="utf-8", errors="replace") as fh:
                hits += fault_hits(fh, now, events=events)
    if not hits:
        return None
    return Blocker("fault_log", f"{len(hits)} fault(s) in the last 5 minutes ({', '.join(sorted(set(hits))[:3])})")


_OOM = re.compile(r"^oom_kill\s+(\d+)$", re.M)


def oom_counts(files: Sequence[Path]) -> dict[str, int]:
    """``oom_kill`` of each readable cgroup memory file."""
    counts = {}
    for path in files:
        try:
            found = _OOM.search(path.read_text())
        except OSError:
            continue
        if found:
            counts[str(path)] = int(found.group(1))
    return counts


def acknowledge_oom(root: Path, files: Sequence[Path]) -> dict[str, int]:
    """Write the current counts as the baseline (after a switch: a fresh start)."""
    counts = oom_counts(files)
    (root / OOM_BASELINE_FILE).write_text(json.dumps(counts))
    return counts


def _out_of_memory(files: Sequence[Path], root: Path) -> Blocker | None:
    try:
        baseline = json.loads((root / OOM_BASELINE_FILE).read_text())
    except (OSError, ValueError):
        baseline = {}
    killed = {p: n - int(baseline.get(p, 0)) for p, n in oom_counts(files).items() if n > int(baseline.get(p, 0))}
    if not killed:
        return None
    return Blocker("out_of_memory", "; ".join(f"{n} OOM kill(s) in {Path(p).parent.name}" for p, n in killed.items()))


def setting_paths(name: str) -> list[Path]:
    return [Path(p) for p in getattr(settings, name, []) or []]


def blockers(*, now: float | None = None, root: Path | None = None, data_dir: Path | None = None) -> list[Blocker]:
    """Every condition that blocks a switch now (empty: idle)."""
    root = root or releases_root()
    moment = time.time() if now is None else now
    found = [
        _call(),
        _run(),
        _delegation(),
        _session_write_lease(),
        _phone_task(Path(data_dir or settings.DATA_DIR)),
        _fault_log(setting_paths("YIMI_RELEASE_FAULT_LOGS"), moment, frozenset(getattr(settings, "YIMI_RELEASE_FAULT_EVENTS", []) or [])),
        _out_of_memory(setting_paths("YIMI_RELEASE_OOM_FILES"), root),
    ]
    return [b for b in found if b is not None]


def wait_for_idle(
    *,
    timeout: float,
    interval: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    progress: Callable[[str], None] = lambda _line: None,
    check: Callable[[], list[Blocker]] = blockers,
) -> None:
    """Return once nothing blocks; ``not_idle`` (naming every blocker) after ``timeout``."""
    start = clock()
    last: list[Any] = []
    while True:
        found = check()
        if not found:
            return
        if [str(b) for b in found] != last:
            progress("waiting for idle: " + "; ".join(str(b) for b in found))
            last = [str(b) for b in found]
        if clock() - start >= timeout:
            raise YimiError("not_idle", "not idle: " + "; ".join(str(b) for b in found))
        sleep(interval)
