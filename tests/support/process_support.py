"""Real platform processes for tests, started against the test database as ``./yimi up``
starts them: the helpers the daphne tests share, and a Celery worker on a queue of its own
that the test process publishes to (``publishing_to``)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection

from yimi_project.celery import app

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# How long a test waits for a worker to start or for a task to end: generous, a deadline for
# a poll on a busy 2-core machine, never a timed assertion.
WORKER_START_SECONDS = 60.0
TASK_SECONDS = 60.0



def database_url_for_subprocesses() -> str:
    d = connection.settings_dict
    auth = quote(d["USER"] or "")
    if d.get("PASSWORD"):
        auth += ":" + quote(d["PASSWORD"])
    return f"postgres://{auth}@{d['HOST'] or '127.0.0.1'}:{d['PORT'] or 5432}/{d['NAME']}"


def subprocess_test_database_url() -> str:
    """The test database, as a URL a subprocess can open (PostgreSQL, or the SQLite file)."""
    if connection.vendor == "postgresql":
        return database_url_for_subprocesses()
    return f"sqlite:///{connection.settings_dict['NAME']}"


def wait_for_sessions_to_end(application_name: str, timeout: float = 10.0) -> None:
    """Let the database sessions of processes that just ended (tagged ``PGAPPNAME``; a
    Celery worker's pool children exit a moment after their parent) close before the test
    database is flushed or dropped. Over a connection of its own: no Django database access
    needed, and this process's own sessions do not count.

    Fails if they are still there after ``timeout``: a process with that tag still runs
    (the caller waits too early: it once waited out the whole timeout on a worker it had not
    stopped yet), and the database would not drop."""
    deadline = time.monotonic() + timeout
    query = "SELECT pid, state, backend_start FROM pg_stat_activity WHERE application_name = %s"
    with psycopg.connect(database_url_for_subprocesses(), autocommit=True) as conn:
        while True:
            left = conn.execute(query, (application_name,)).fetchall()
            if not left:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"{len(left)} database sessions of {application_name!r} still open after {timeout:g} s: {left}")
            time.sleep(0.1)


def stop_processes(procs: list[subprocess.Popen[bytes]], timeout: float = 10.0) -> None:
    """SIGTERM to all of ``procs`` at once, then wait for each; one that has not ended
    within ``timeout`` is killed."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def new_prefix(kind: str) -> str:
    """A Redis prefix of its own (channel layer, task queue, kombu's keys) for one group of
    processes, so parallel test runs sharing one Redis never take each other's tasks."""
    base = os.environ.get("YIMI_TEST_CHANNEL_PREFIX", "yimi-test")
    return f"{base}-{kind}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def redis_prefix(kind: str) -> Iterator[str]:
    """A new prefix (``new_prefix``) whose Redis keys are deleted when the block ends."""
    prefix = new_prefix(kind)
    try:
        yield prefix
    finally:
        client = redis.Redis.from_url(django_settings.REDIS_URL)
        try:
            for key in client.scan_iter(match=f"{prefix}:*", count=500):
                client.delete(key)
        finally:
            client.close()


def worker_env(prefix: str, **overrides: str) -> dict[str, str]:
    """A worker's environment: production settings on the test database and Redis, its
    queue (``<prefix>-tasks``) and Redis keys under ``prefix``."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "yimi_project.settings",
        "DATABASE_URL": database_url_for_subprocesses(),
        "REDIS_URL": django_settings.REDIS_URL,
        "YIMI_CHANNEL_PREFIX": prefix,
        "YIMI_CELERY_KEY_PREFIX": f"{prefix}:",
        "YIMI_DATA_DIR": str(django_settings.DATA_DIR),
        "YIMI_PACK_SANDBOX": django_settings.YIMI_PACK_SANDBOX,
        "PGAPPNAME": prefix,  # libpq tags every connection of these processes
        "PYTHONUNBUFFERED": "1",
        **overrides,
    }


LANE_LINE = re.compile(r"run_lane_run_ended run_id=(?P<run>[0-9a-f-]{36}) outcome=(?P<outcome>\w+)")
TASK_LINE = re.compile(r"Task (?P<name>[\w.]+)\[(?P<id>[0-9a-f-]{36})\] (?P<event>received|succeeded in [\d.e-]+s: (?P<result>.*)|raised .*|retry: .*)$")


class CeleryWorker:
    """``celery -A yimi_project worker`` (the settings' thread pool, acks late, as production
    runs it) in a session of its own, so ``kill`` takes its pack processes with it.
    Its INFO log (one file) says which task ran, when, and what it returned."""

    def __init__(self, env: dict[str, str], log: Path, *, concurrency: int = 2, name: str = "") -> None:
        self.env = env
        self.log = log
        self.prefix = name
        self.since = 0  # ``tasks`` reads the log from here on (a test sets it when it starts)
        args = [str(BIN / "celery"), "-A", "yimi_project", "worker", "--loglevel=INFO", f"--concurrency={concurrency}"]
        if name:
            # A node name of its own and no chatter with other workers on the same Redis.
            args += ["-n", f"{name}@%h", "--without-mingle", "--without-gossip"]
        with open(log, "w") as out:
            self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, chars: int = 4000) -> str:
        return f"--- {self.log.name} ---\n" + self.text()[-chars:]

    def wait_until(self, what: str, condition: Any, timeout: float = TASK_SECONDS) -> Any:
        """Poll ``condition()`` until it returns something true; fail with the log's tail."""
        deadline = time.monotonic() + timeout
        while True:
            result = condition()
            if result:
                return result
            if self.proc.poll() is not None:
                pytest.fail(f"the worker exited ({self.proc.returncode}) while waiting for {what}\n{self.tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}\n{self.tail()}")
            time.sleep(0.1)

    def wait_ready(self) -> CeleryWorker:
        self.wait_until("the worker to be ready", lambda: " ready." in self.text(), WORKER_START_SECONDS)
        return self

    def tasks(self, name: str = "") -> dict[str, dict[str, Any]]:
        """Every task this worker received, by id: ``received`` (bool), ``result`` (the repr
        of what it returned, once it succeeded) and ``done`` (it ended, one way or another)."""
        seen: dict[str, dict[str, Any]] = {}
        for line in self.text()[self.since :].splitlines():
            match = TASK_LINE.search(line)
            if match is None or (name and match["name"] != name):
                continue
            task = seen.setdefault(match["id"], {"name": match["name"], "received": False, "result": None, "done": False})
            if match["event"] == "received":
                task["received"] = True
            else:
                task["done"] = True
                task["result"] = match["result"]
        return seen

    def wait_for_results(self, name: str, count: int, timeout: float = TASK_SECONDS) -> list[str]:
        """Wait until ``count`` tasks called ``name`` have ended here; their results."""

        def ended() -> list[str] | None:
            done = [t["result"] for t in self.tasks(name).values() if t["done"]]
            return done if len(done) >= count else None

        return self.wait_until(f"{count} × {name}", ended, timeout)

    def lane_runs(self) -> dict[str, str]:
        """Every run this worker took from the run lane (``brain.run_lane``) and ended: run
        id → its outcome (the run's final state, or "skipped")."""
        return {m["run"]: m["outcome"] for m in LANE_LINE.finditer(self.text()[self.since :])}

    def wait_for_lane_runs(self, run_ids: Iterable[Any], timeout: float = TASK_SECONDS) -> dict[str, str]:
        """Wait until each of ``run_ids`` has ended here, taken from the run lane; their outcomes."""
        wanted = {str(run_id) for run_id in run_ids}

        def ended() -> dict[str, str] | None:
            runs = self.lane_runs()
            return {run_id: runs[run_id] for run_id in wanted} if wanted <= runs.keys() else None

        return self.wait_until(f"runs {sorted(wanted)} from the run lane", ended, timeout)

    def wait_idle(self, timeout: float = TASK_SECONDS) -> None:
        """Every task received so far has ended (none still waiting for its countdown)."""
        self.wait_until("the worker's tasks to end", lambda: all(t["done"] for t in self.tasks().values()), timeout)

    def kill(self) -> None:
        """SIGKILL to the whole session: the worker, its pool and its pack processes die at once."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        """A warm shutdown (SIGTERM); SIGKILL to the session if it does not end in time."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


@contextlib.contextmanager
def celery_worker(prefix: str, log: Path, *, concurrency: int = 2, **env: str) -> Iterator[CeleryWorker]:
    """A ready worker consuming ``<prefix>-tasks``; stopped (and its database sessions
    gone) when the block ends."""
    worker = CeleryWorker(worker_env(prefix, **env), log, concurrency=concurrency, name=prefix)
    try:
        yield worker.wait_ready()
    finally:
        worker.stop()
        wait_for_sessions_to_end(prefix)


def _reset_producers(app: Any) -> None:
    """Forget the app's broker connections and routing, so the next publish uses its
    current configuration."""
    app._pool = None
    app.__dict__.pop("amqp", None)


@contextlib.contextmanager
def publishing_to(prefix: str, settings: Any) -> Iterator[Any]:
    """This (test) process publishes its tasks to the workers started with ``prefix``: the
    broker is switched on (``dispatch.uses_broker()``), tasks go to ``<prefix>-tasks`` with
    kombu's keys under ``prefix``. Undone when the block ends."""
    keys = ("broker_url", "task_default_queue", "broker_transport_options")
    saved = {key: app.conf[key] for key in keys}
    settings.CELERY_BROKER_URL = django_settings.REDIS_URL
    app.conf.update(
        broker_url=django_settings.REDIS_URL,
        task_default_queue=f"{prefix}-tasks",
        broker_transport_options={**django_settings.CELERY_BROKER_TRANSPORT_OPTIONS, "global_keyprefix": f"{prefix}:"},
    )
    _reset_producers(app)
    try:
        yield app
    finally:
        app.conf.update(saved)
        _reset_producers(app)
