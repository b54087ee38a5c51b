"""Services of a directory release: processes started from the release directory.

A ``ProcessService`` is one long-running process (a daphne, a worker) whose command line
names the release directory as ``{release}`` (``{release}/venv/bin/daphne …``), started in
``{release}/code`` in a session of its own, stopped with SIGTERM to its process group (then
SIGKILL), and checked over HTTP: its health URL answers 200 with a JSON body whose
``status`` is ``ok`` and whose ``build`` is the build id the process runs (read from its
release's ``release.json``; ``yimi_project.views`` reports it to loopback callers). For a
Yimi web process that URL is the liveness answer, ``/api/health/live/`` (this process and
its database): the readiness answer, ``/api/health/``, is 503 whenever the brain or Redis
is down, and a switch's verify or the watchdog would take a good release for a broken one.

The services of a host are listed in ``<releases root>/services.json``:
``[{"name": "web", "argv": ["{release}/venv/bin/daphne", …], "health_url":
"http://127.0.0.1:8000/api/health/live/", "env": {…}}]`` — the deployer's file, read by
``manage.py release switch|rollback`` and the watchdog (a readiness URL there is logged,
``release_health_url_is_readiness``). A service runs with this process's environment plus its ``env``, and ``YIMI_DATA_DIR`` is
this process's data directory unless its ``env`` names another: the settings' default,
``./var`` beside the code, would be inside the release's read-only ``code/`` (a process
as root would make a new, empty data directory there). Each service's pid is kept in
``<root>/run/<name>.pid`` (with the process's start time), so the next invocation stops
the process an earlier one started.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings

from yimi_project.errors import YimiError
from yimi_project.logs import log_event

SERVICES_FILE = "services.json"


class ProcessService:
    """One process of a release (``releases.pointers.Service``)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        health_url: str,
        env: dict[str, str] | None = None,
        ready_seconds: float = 60.0,
        stop_seconds: float = 15.0,
        sleep: Callable[[float], None] = time.sleep,
        run_dir: Path | None = None,
    ) -> None:
        if not argv:
            raise YimiError("invalid_request", f"service {name!r} has no command")
        self.name = name
        self.argv = list(argv)
        self.health_url = health_url
        self.env = dict(env or {})
        self.ready_seconds = ready_seconds
        self.stop_seconds = stop_seconds
        self.sleep = sleep
        self.run_dir = run_dir
        self.process: subprocess.Popen[bytes] | None = None
        self.release: Path | None = None

    # A process started by another invocation (an earlier ``release switch``) is found
    # through its pid file: pid plus the kernel's start time, so a reused pid is never hit.

    @property
    def pid_file(self) -> Path | None:
        return self.run_dir / f"{self.name}.pid" if self.run_dir else None

    def _recorded(self) -> int | None:
        path = self.pid_file
        if path is None or not path.is_file():
            return None
        try:
            body = json.loads(path.read_text())
            pid, started = int(body["pid"]), str(body["started"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return pid if _start_time(pid) == started else None

    def _expand(self, text: str, release: Path) -> str:
        return text.replace("{release}", str(release))

    def start(self, release: Path) -> None:
        """Start the process from ``release`` and wait until its health URL answers at all
        (healthy or not) or it exits; ``verify`` then judges the answer."""
        self.stop()
        self.release = release
        logs = release / "logs"
        logs.mkdir(exist_ok=True)
        env = {**os.environ, **{k: self._expand(v, release) for k, v in self.env.items()}}
        with open(logs / f"{self.name}.log", "ab") as log:
            self.process = subprocess.Popen(
                [self._expand(a, release) for a in self.argv],
                cwd=release / "code" if (release / "code").is_dir() else release,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        if self.pid_file is not None:
            self.pid_file.parent.mkdir(parents=True, exist_ok=True)
            self.pid_file.write_text(json.dumps({"pid": self.process.pid, "started": _start_time(self.process.pid)}))
        deadline = time.monotonic() + self.ready_seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise YimiError("service_exited", f"{self.name} exited with {self.process.returncode} while starting")
            if self._answer() is not None:
                return
            self.sleep(0.05)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=self.stop_seconds)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        recorded = self._recorded()
        if recorded is not None:
            _stop_group(recorded, self.stop_seconds, self.sleep)
        if self.pid_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.pid_file.unlink()

    def _answer(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(self.health_url, timeout=3) as response:
                body = json.loads(response.read() or b"{}")
                return {"http": response.status, **(body if isinstance(body, dict) else {})}
        except urllib.error.HTTPError as exc:
            return {"http": exc.code}
        except (OSError, ValueError):
            return None

    def running(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return self._recorded() is not None

    def health(self) -> bool:
        answer = self._answer()
        return bool(self.running() and answer and answer.get("http") == 200 and answer.get("status") == "ok")

    def build_id(self) -> str | None:
        answer = self._answer()
        build = answer.get("build") if answer else None
        return str(build) if build else None


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (``/proc/<pid>/stat`` field 22); None when
    it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else fields[19]


def _stop_group(pid: int, seconds: float, sleep: Callable[[float], None]) -> None:
    """SIGTERM to the process group of ``pid`` (a process of another invocation), then
    SIGKILL if it is still there after ``seconds``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaps it when it happens to be our own child
        if _start_time(pid) is None:
            return
        sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def load_services(root: Path) -> list[ProcessService]:
    """The host's services from ``<root>/services.json`` (missing or malformed: a clear
    ``release_services_missing`` / ``release_services_invalid``); each one's environment
    names this process's data directory unless its ``env`` sets ``YIMI_DATA_DIR``."""
    path = root / SERVICES_FILE
    if not path.is_file():
        raise YimiError(
            "release_services_missing",
            f"no {path}: list the services a release runs (name, argv with {{release}}, health_url) there first",
        )
    try:
        rows = json.loads(path.read_text())
        services = [
            ProcessService(
                str(r["name"]), [str(a) for a in r["argv"]], health_url=str(r["health_url"]),
                env={"YIMI_DATA_DIR": str(settings.DATA_DIR), **(r.get("env") or {})}, run_dir=root / "run",
            )
            for r in rows
        ]
    except (ValueError, KeyError, TypeError) as exc:
        raise YimiError("release_services_invalid", f"{path} is not a list of services ({exc})") from None
    for service in services:
        if urllib.parse.urlsplit(service.health_url).path.rstrip("/") == "/api/health":
            log_event(
                "release_health_url_is_readiness", level=logging.WARNING, service=service.name,
                advice="services.json names /api/health/ (503 while the brain or Redis is down); use /api/health/live/",
            )
    return services
