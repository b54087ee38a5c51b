"""What the watchdog process looks at and does on a real host (``manage.py release_watchdog``):
the observations ``releases.watchdog.step`` needs, the rollback and the owner's notices.

- **pointers** from the releases root (``releases.pointers``), the switch that made
  ``current`` current from the root's ``history.jsonl`` (no database needed);
- **health**: every service in ``<root>/services.json`` answers its health URL with 200 and
  ``status: ok``;
- **restarts**: with ``--docker-container``, the sum of Docker's ``RestartCount``; without
  Docker, each time a service that had stopped answering at all answers again (a process
  that died and came back), counted by this process;
- **rollback**: ``pointers.rollback_to_previous`` with ``expected_current`` = the watched
  build (a release that took over meanwhile is never replaced), projecting the core memory
  for the old version first when the database answers (the rollback does not wait for it);
- **notices**: ``releases.notices.notify_owner`` and a ``watchdog`` history event; a
  database that does not answer leaves the notice pending for the next tick.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from releases import memory_bridge, notices, pointers, processes
from releases import services as release_services
from releases.models import Release
from releases.watchdog import Notice, Observation, Pointers, Rollback
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

Answer = tuple[int, dict[str, Any]] | None  # (HTTP status, JSON body), or None: no answer at all


def fetch(url: str, timeout: float = 3.0) -> Answer:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = json.loads(response.read() or b"{}")
            return response.status, body if isinstance(body, dict) else {}
    except urllib.error.HTTPError as exc:
        return exc.code, {}
    except (OSError, ValueError):
        return None


class HealthProbe:
    """Health of the host's services by their health URLs, and restarts as answers that
    come back after none (see the module docstring)."""

    def __init__(self, urls: dict[str, str], *, fetch: Callable[[str], Answer] = fetch) -> None:
        self.urls = dict(urls)
        self.fetch = fetch
        self.down = dict.fromkeys(self.urls, False)
        self.restarts = 0

    def look(self) -> tuple[bool, int]:
        healthy = bool(self.urls)
        for name, url in self.urls.items():
            answer = self.fetch(url)
            if answer is None:
                self.down[name] = True
                healthy = False
                continue
            if self.down[name]:
                self.restarts += 1
                self.down[name] = False
            status, body = answer
            healthy = healthy and status == 200 and body.get("status") == "ok"
        return healthy, self.restarts


def docker_restarts(containers: Sequence[str]) -> int:
    """The sum of Docker's restart counters of ``containers`` (``docker inspect``)."""
    try:
        out = subprocess.run(
            ["docker", "inspect", "--format", "{{.RestartCount}}", *containers],
            check=True, capture_output=True, text=True, timeout=30,
        ).stdout
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        raise YimiError("watchdog_docker_unavailable", f"docker inspect failed: {exc}") from exc
    return sum(int(line) for line in out.split() if line.strip().isdigit())


def switch_id(root: Path, current: str | None) -> str:
    """The time of the switch that made ``current`` current (from the history); '' when no
    switch did (a release installed by hand, or the first one)."""
    for row in reversed(pointers.read_history(root)):
        if row.get("kind") == "switch" and row.get("to_build") == current:
            return str(row.get("at") or current)
    return ""


def observer(root: Path, probe: HealthProbe, *, containers: Sequence[str] = (), clock: Callable[[], float] = time.time) -> Callable[[], Observation]:
    def observe() -> Observation:
        ptrs = pointers.read_pointers(root)
        healthy, counted = probe.look()
        restarts = docker_restarts(containers) if containers else counted
        return Observation(clock(), Pointers(ptrs.current_build, ptrs.previous_build, switch_id(root, ptrs.current_build)), healthy, restarts)

    return observe


def health_urls(root: Path) -> dict[str, str]:
    return {s.name: s.health_url for s in processes.load_services(root)}


def roller(root: Path, services: Callable[[], Sequence[pointers.Service]]) -> Callable[[Rollback], None]:
    def rollback(action: Rollback) -> None:
        result = pointers.rollback_to_previous(
            f"watchdog: {action.reason}", services=services(), root=root, expected_current=action.from_build,
            before_switch=memory_bridge.before_rollback,  # best effort: going back does not wait for it
        )
        if not result.ok:
            raise YimiError("rollback_failed", result.summary())
        try:
            release = Release.objects.filter(build_id=action.from_build).first()
            if release is not None:
                release_services.advance(release, Release.State.ROLLED_BACK, expected=(Release.State.SWITCHED,), reason=f"watchdog: {action.reason}")
        except Exception as exc:  # noqa: BLE001 - the pointers are the truth; the row is the record
            log_event("watchdog_row_unchanged", logging.WARNING, error=type(exc).__name__)

    return rollback


def notifier() -> Callable[[Notice], bool]:
    def notify(notice: Notice) -> bool:
        try:
            entry = notices.notify_owner(notice.notice_id, notice.code, notice.text)
            if entry is None:
                return False
            release_services.record_event("watchdog", reason=notice.text, details={"code": notice.code, "notice_id": notice.notice_id})
        except Exception as exc:  # noqa: BLE001 - stays pending, sent again with the same id
            log_event("watchdog_notice_failed", logging.WARNING, code=notice.code, error=type(exc).__name__)
            return False
        return True

    return notify
