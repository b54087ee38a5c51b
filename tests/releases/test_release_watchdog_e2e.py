"""The watchdog command end to end on a host of directory releases: real service processes
started from the release directories (``releases.processes``), a broken new release that
answers its health URL with 503, ``manage.py release_watchdog --once`` run as separate
ticks: it rolls back once, the old release's process serves again, the owner is told once.

U is 1 ms so the second tick is past it however fast the machine is (no timed assertion)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from memory.models import TimelineEntry
from releases import pointers, processes
from releases.watchdog_host import fetch
from tests.support.ports import free_port

SERVER = '''
import json, pathlib, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
here = pathlib.Path(__file__).resolve().parent
build = json.loads((here / "release.json").read_text())["build_id"]
broken = (here / "broken").exists()
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"status": "degraded" if broken else "ok", "build": build}).encode()
        self.send_response(503 if broken else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''



def release(root: Path, name: str, *, broken: bool = False) -> pointers.ReleaseDir:
    path = root / name
    path.mkdir()
    (path / "serve.py").write_text(SERVER)
    if broken:
        (path / "broken").write_text("")
    made = pointers.ReleaseDir(path=path.resolve(), build_id=f"dir:{name}", commit=name * 40)
    made.write()
    return made


def tick(root: Path) -> None:
    call_command("release_watchdog", "--root", str(root), "--once", "--unhealthy-seconds", "0.001",
                 "--window-seconds", "60", "--restart-limit", "3")


@pytest.mark.django_db
def test_a_broken_release_is_rolled_back_once_by_the_command(owner: Any, tmp_path: Path) -> None:
    root = (tmp_path / "releases").resolve()
    root.mkdir()
    port = free_port()
    health = f"http://127.0.0.1:{port}/api/health/"
    (root / processes.SERVICES_FILE).write_text(json.dumps([
        {"name": "web", "argv": [sys.executable, "{release}/serve.py", str(port)], "health_url": health},
    ]))
    a, b = release(root, "a"), release(root, "b", broken=True)
    pointers.set_pointer(root, pointers.PREVIOUS, a)
    pointers.set_pointer(root, pointers.CURRENT, b)
    pointers.append_history(root, "switch", {"from_build": a.build_id, "to_build": b.build_id})
    processes.load_services(root)[0].start(b.path)  # what the switch left running
    try:
        assert fetch(health) == (503, {})  # the new release answers, unhealthy
        tick(root)  # t_b
        assert pointers.read_pointers(root).current_build == "dir:b"
        tick(root)  # t - t_b >= U: the intent, then the rollback
        assert pointers.read_pointers(root).current_build == "dir:a"
        assert fetch(health) == (200, {"status": "ok", "build": "dir:a"})  # the old release's process serves
        tick(root)  # observes: back on the previous build, tells the owner
        tick(root)
        state = json.loads((root / "watchdog-state.json").read_text())
        assert state["phase"] == "rolled_back" and state["intent"]["from"] == "dir:b"
        assert [r["kind"] for r in pointers.read_history(root)] == ["switch", "rollback"]  # tried once
        told = TimelineEntry.objects.filter(owner=owner, notice_code="watchdog_rolled_back")
        assert told.count() == 1 and "unhealthy" in told.get().text
    finally:
        processes.load_services(root)[0].stop()
    assert fetch(health) is None


@pytest.mark.django_db
def test_the_watchdog_process_carries_out_the_owners_request(owner: Any, tmp_path: Path, settings: Any) -> None:
    """A requested rollback is executed by the watchdog (no rollback stops it), and the
    Celery task leaves it alone when it runs inside a service the rollback would stop."""
    from releases import requested, tasks

    root = (tmp_path / "releases").resolve()
    root.mkdir()
    settings.YIMI_RELEASES_ROOT = str(root)
    port = free_port()
    health = f"http://127.0.0.1:{port}/api/health/"
    (root / processes.SERVICES_FILE).write_text(json.dumps([
        {"name": "web", "argv": [sys.executable, "{release}/serve.py", str(port)], "health_url": health},
    ]))
    a, b = release(root, "a"), release(root, "b")  # both healthy: the watchdog itself has nothing to do
    pointers.set_pointer(root, pointers.PREVIOUS, a)
    pointers.set_pointer(root, pointers.CURRENT, b)
    pointers.append_history(root, "switch", {"from_build": a.build_id, "to_build": b.build_id})
    web = processes.load_services(root)[0]
    web.start(b.path)
    try:
        request = requested.request_rollback(owner, "这个版本不好用", root=root)
        assert not tasks.inside_a_service(processes.load_services(root))  # this test process is no service
        tick(root)
        request.refresh_from_db()
        assert request.state == "executed" and pointers.read_pointers(root).current_build == "dir:a"
        assert fetch(health) == (200, {"status": "ok", "build": "dir:a"})
        assert [r["kind"] for r in pointers.read_history(root)] == ["switch", "rollback"]
    finally:
        processes.load_services(root)[0].stop()


def test_a_worker_inside_a_service_leaves_the_rollback_to_the_watchdog(tmp_path: Path) -> None:
    import os

    from releases import tasks

    root = (tmp_path / "releases").resolve()
    root.mkdir()
    (root / processes.SERVICES_FILE).write_text(json.dumps([
        {"name": "worker", "argv": [sys.executable, "-c", "pass"], "health_url": "http://127.0.0.1:9/"},
    ]))
    [worker] = processes.load_services(root)
    assert not tasks.inside_a_service([worker])
    worker.pid_file.parent.mkdir(parents=True, exist_ok=True)
    worker.pid_file.write_text(json.dumps({"pid": os.getpgid(0), "started": "0"}))  # as if this process group were the worker's
    assert tasks.inside_a_service([worker])
