"""The watchdog on a real host: the command's refusal without U/W/L, the health probe
against a real HTTP server that stops and comes back, the rollback through the real
pointers, and notices that reach the owner's timeline once."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from memory.assertions import store as assertions
from memory.models import TimelineEntry
from releases import pointers, watchdog_host
from releases.models import Release
from releases.watchdog import Notice, Rollback, StateFile, Thresholds, run_once
from tests.releases.test_release_requests import RecordingService, make_release


class HealthServer:
    """A real HTTP server answering /health with a chosen status, on a fixed port."""

    def __init__(self, port: int = 0) -> None:
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = json.dumps({"status": "ok" if outer.status == 200 else "degraded"}).encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/health"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_command_refuses_to_start_without_u_w_l(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("YIMI_WATCHDOG_UNHEALTHY_SECONDS", "YIMI_WATCHDOG_WINDOW_SECONDS", "YIMI_WATCHDOG_RESTART_LIMIT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(CommandError) as err:
        call_command("release_watchdog", "--root", str(tmp_path), "--once")
    text = str(err.value)
    assert text.startswith("watchdog_thresholds_missing") and "U (" in text and "W (" in text and "L (" in text
    monkeypatch.setenv("YIMI_WATCHDOG_UNHEALTHY_SECONDS", "180")
    with pytest.raises(CommandError) as err:
        call_command("release_watchdog", "--root", str(tmp_path), "--once", "--window-seconds", "180")
    assert "L (" in str(err.value) and "U (" not in str(err.value) and "W (" not in str(err.value)
    assert not (tmp_path / "watchdog-state.json").exists()  # refused: nothing was written


def test_the_command_needs_the_hosts_services(tmp_path: Path) -> None:
    with pytest.raises(CommandError) as err:
        call_command("release_watchdog", "--root", str(tmp_path), "--once", "--unhealthy-seconds", "180",
                     "--window-seconds", "180", "--restart-limit", "3")
    assert str(err.value).startswith("release_services_missing")


def test_the_probe_counts_a_service_that_comes_back_as_a_restart() -> None:
    server = HealthServer()
    probe = watchdog_host.HealthProbe({"web": server.url})
    try:
        assert probe.look() == (True, 0)
        server.status = 503
        assert probe.look() == (False, 0)  # answering, unhealthy: not a restart
        server.status = 200
        assert probe.look() == (True, 0)
    finally:
        server.close()
    assert probe.look() == (False, 0)  # no answer at all: down
    again = HealthServer(server.port)  # the process comes back on its port
    try:
        assert probe.look() == (True, 1)
        assert probe.look() == (True, 1)
    finally:
        again.close()


@pytest.mark.django_db
def test_a_watchdog_rollback_on_the_real_pointers_tells_the_owner_once(owner: Any, tmp_path: Path) -> None:
    root = (tmp_path / "releases").resolve()
    root.mkdir()
    a, b = make_release(root, "a"), make_release(root, "b")
    pointers.set_pointer(root, pointers.PREVIOUS, a)
    pointers.set_pointer(root, pointers.CURRENT, b)
    pointers.append_history(root, "switch", {"from_build": a.build_id, "to_build": b.build_id})
    row = Release.objects.create(build_id=b.build_id, kind="directory", commit="b" * 40, state="switched",
                                 created_at="2026-12-01T00:00:00Z")
    assertions.commit(assertions.CommitRequest(owner_id=owner.id, request_id="n1", predicate=assertions.CORE_PROFILE,
                                               payload={"text": "likes green tea", "doc": "memory"}, expected_version=0))
    server = HealthServer()
    server.status = 503
    service = RecordingService()
    now = [1000.0]
    observe = watchdog_host.observer(root, watchdog_host.HealthProbe({"web": server.url}), clock=lambda: now[0])
    rollback = watchdog_host.roller(root, lambda: [service])
    notify = watchdog_host.notifier()
    store = StateFile(root / "watchdog-state.json")
    th = Thresholds(60, 60, 3)
    try:
        run_once(store, observe, rollback, notify, th)
        now[0] += 60
        tick = run_once(store, observe, rollback, notify, th)
        assert tick.rolled_back
        for _ in range(3):
            now[0] += 10
            run_once(store, observe, rollback, notify, th)
    finally:
        server.close()
    assert pointers.read_pointers(root).current_build == a.build_id and service.build_id() == a.build_id
    assert "likes green tea" in (root / "a" / "memory" / "MEMORY.md").read_text()
    row.refresh_from_db()
    assert row.state == "rolled_back"
    told = TimelineEntry.objects.filter(owner=owner, kind="notice", notice_code="watchdog_rolled_back")
    assert told.count() == 1 and "database was not restored" in told.get().text
    # the same notice sent again (an interrupted delivery) is still one entry
    assert notify(Notice(store.load().sent_notices[0], "watchdog_rolled_back", "again"))
    assert told.count() == 1


@pytest.mark.django_db
def test_a_rollback_when_a_newer_release_took_over_moves_nothing(owner: Any, tmp_path: Path) -> None:
    root = (tmp_path / "releases").resolve()
    root.mkdir()
    a, b, c = make_release(root, "a"), make_release(root, "b"), make_release(root, "c")
    pointers.set_pointer(root, pointers.PREVIOUS, b)
    pointers.set_pointer(root, pointers.CURRENT, c)
    with pytest.raises(Exception) as err:
        watchdog_host.roller(root, lambda: [RecordingService()])(Rollback("unhealthy", b.build_id, a.build_id))
    assert getattr(err.value, "code", "") == "current_changed"
    assert pointers.read_pointers(root).current_build == c.build_id
