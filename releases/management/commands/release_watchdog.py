"""``manage.py release_watchdog``: the release watchdog, a long-running process apart from
the web and worker processes (docker/compose.yaml service ``watchdog``).

It refuses to start without ``U``, ``W`` and ``L`` (options or environment): they have no
built-in defaults. Each tick is ``releases.watchdog.run_once`` on the real host
(``releases.watchdog_host``), then the owner's waiting rollback requests at an idle moment
(``releases.requested``); ``--once`` runs one tick and exits.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from functools import partial
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from releases import idle, pointers, processes, requested, watchdog, watchdog_host
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

ENV = {
    "unhealthy_seconds": "YIMI_WATCHDOG_UNHEALTHY_SECONDS",
    "window_seconds": "YIMI_WATCHDOG_WINDOW_SECONDS",
    "restart_limit": "YIMI_WATCHDOG_RESTART_LIMIT",
}
STATE_FILE = "watchdog-state.json"


class Command(BaseCommand):
    help = "Watch the release a switch brought in; roll back once when it stays unhealthy (U) or restarts L times within W."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--unhealthy-seconds", help=f"U: continuous unhealth that rolls back (or {ENV['unhealthy_seconds']})")
        parser.add_argument("--window-seconds", help=f"W: the window restarts are counted in (or {ENV['window_seconds']})")
        parser.add_argument("--restart-limit", help=f"L: restarts within W that roll back (or {ENV['restart_limit']})")
        parser.add_argument("--root", help="the releases root (default: YIMI_RELEASES_ROOT or <data dir>/releases)")
        parser.add_argument("--state-file", help=f"the watchdog's state (default: <root>/{STATE_FILE})")
        parser.add_argument("--interval", type=float, default=5.0, help="seconds between looks (default 5)")
        parser.add_argument("--docker-container", action="append", default=[], help="count restarts with docker inspect (repeatable)")
        parser.add_argument("--once", action="store_true", help="one look, then exit")

    def handle(self, *args: Any, **options: Any) -> None:
        values = {name: options.get(name) or os.environ.get(env) for name, env in ENV.items()}
        try:
            thresholds = watchdog.Thresholds.from_values(values["unhealthy_seconds"], values["window_seconds"], values["restart_limit"])
        except YimiError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc
        if options["interval"] <= 0:
            raise CommandError("invalid_request: --interval must be more than 0 seconds")
        root = Path(options["root"]) if options["root"] else pointers.releases_root()
        store = watchdog.StateFile(Path(options["state_file"]) if options["state_file"] else root / STATE_FILE)
        try:
            probe = watchdog_host.HealthProbe(watchdog_host.health_urls(root))
        except YimiError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc
        observe = watchdog_host.observer(root, probe, containers=options["docker_container"])
        rollback = watchdog_host.roller(root, lambda: processes.load_services(root))
        notify = watchdog_host.notifier()
        self.stdout.write(
            f"watchdog on {root}: U={thresholds.unhealthy_seconds:g} s, W={thresholds.window_seconds:g} s, "
            f"L={thresholds.restart_limit}, a look every {options['interval']:g} s; state in {store.path}"
        )
        stopping = False

        def stop(_signum: int, _frame: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        last = ""
        while not stopping:
            try:
                tick = watchdog.run_once(store, observe, rollback, notify, thresholds)
            except YimiError as exc:
                raise CommandError(f"{exc.code}: {exc.message}") from exc
            line = self._describe(tick)
            if line != last:
                self.stdout.write(line)
                last = line
            for outcome in self._requests(root):
                self.stdout.write(f"rollback request {outcome.request.id}: {outcome.state} ({outcome.detail})")
            if options["once"]:
                return
            time.sleep(options["interval"])

    @staticmethod
    def _requests(root: Path) -> list[requested.Outcome]:
        """The owner's rollback requests, executed here at an idle moment: no rollback stops
        this process (a worker running one would stop itself, ``releases.tasks``). The
        database not answering is no reason to stop watching."""
        try:
            return requested.execute_pending(
                idle_check=partial(idle.blockers, root=root), services=processes.load_services(root), root=root
            )
        except Exception as exc:  # noqa: BLE001 - logged; tried again next look
            log_event("watchdog_requests_failed", logging.WARNING, error=type(exc).__name__)
            return []

    @staticmethod
    def _describe(tick: watchdog.Tick) -> str:
        state = tick.state
        if state is None:
            return "nothing to watch: no switch with a previous release"
        text = f"{state.phase}: {state.new_build} (previous {state.previous_build})"
        if state.unhealthy_since is not None:
            text += ", unhealthy"
        if state.outcome:
            text += f" - {state.outcome}"
        if tick.rolled_back:
            text += " - rolled back"
        return text
