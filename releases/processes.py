"""Services of a directory release: processes started from the release directory.

A ``ProcessService`` is one long-running process (a daphne, a worker) whose command line
names the release directory as ``{release}`` (``{release}/venv/bin/daphne …``), started in
``{release}/code`` in a session of its own, stopped with SIGTERM to its process group (then
SIGKILL), and checked over HTTP: its health URL answers 200 with a JSON body whose
``status`` is ``ok`` and whose ``build`` is the build id the process runs (read from its
release's ``release.json``; ``yimi_project.views.health`` reports it to loopback callers).

The services of a host are listed in ``<releases root>/services.json``:
``[{"name": "web", "argv": ["{release}/venv/bin/daphne", …], "health_url": "http://…",
"env": {…}}]`` — the deployer's file, read by ``manage.py release switch|rollback``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from yimi_project.errors import YimiError

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
        self.process: subprocess.Popen[bytes] | None = None
        self.release: Path | None = None

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
        deadline = time.monotonic() + self.ready_seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise YimiError("service_exited", f"{self.name} exited with {self.process.returncode} while starting")
            if self._answer() is not None:
                return
            self.sleep(0.05)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=self.stop_seconds)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

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
        return self.process is not None and self.process.poll() is None

    def health(self) -> bool:
        answer = self._answer()
        return bool(self.running() and answer and answer.get("http") == 200 and answer.get("status") == "ok")

    def build_id(self) -> str | None:
        answer = self._answer()
        build = answer.get("build") if answer else None
        return str(build) if build else None


def load_services(root: Path) -> list[ProcessService]:
    """The host's services from ``<root>/services.json`` (missing or malformed: a clear
    ``release_services_missing`` / ``release_services_invalid``)."""
    path = root / SERVICES_FILE
    if not path.is_file():
        raise YimiError(
            "release_services_missing",
            f"no {path}: list the services a release runs (name, argv with {{release}}, health_url) there first",
        )
    try:
        rows = json.loads(path.read_text())
        return [
            ProcessService(str(r["name"]), [str(a) for a in r["argv"]], health_url=str(r["health_url"]), env=r.get("env"))
            for r in rows
        ]
    except (ValueError, KeyError, TypeError) as exc:
        raise YimiError("release_services_invalid", f"{path} is not a list of services ({exc})") from None
