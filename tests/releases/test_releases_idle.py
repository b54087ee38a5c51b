"""Waiting for idle: each condition blocks a switch on its own, by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from accounts.models import VoiceCall
from brain.models import AgentTask, Run
from brain.services import accept_utterance
from memory.locks import MEMORY_LOCK_SPACE
from releases import idle
from tests.conftest import new_client_id
from yimi_project.errors import YimiError

pytestmark = pytest.mark.django_db


@pytest.fixture
def quiet(tmp_path: Path, settings: Any) -> dict[str, Any]:
    """An idle host: its own data directory and releases root, no logs, no cgroups."""
    settings.YIMI_RELEASES_ROOT = tmp_path / "releases"
    settings.YIMI_RELEASE_FAULT_LOGS = []
    settings.YIMI_RELEASE_OOM_FILES = []
    (tmp_path / "releases").mkdir()
    (tmp_path / "data").mkdir()
    return {"root": tmp_path / "releases", "data_dir": tmp_path / "data"}


def names(quiet: dict[str, Any], **kwargs: Any) -> list[str]:
    return [b.condition for b in idle.blockers(**quiet, **kwargs)]


def test_an_idle_host_has_no_blockers(quiet: dict[str, Any]) -> None:
    assert idle.blockers(**quiet) == []


def test_an_open_call_blocks(quiet: dict[str, Any], make_device: Any) -> None:
    phone = make_device()
    call = VoiceCall.objects.create(owner=phone.device.owner, device=phone.device, call_id="c1", channel="phone_call")
    assert names(quiet) == ["call"]
    VoiceCall.objects.filter(id=call.id).update(ended_at=call.started_at)
    assert names(quiet) == []


def test_a_run_blocks_and_a_background_delegation_blocks(quiet: dict[str, Any], make_device: Any) -> None:
    phone = make_device()
    run = Run.objects.get(id=accept_utterance(phone.device, new_client_id(), "hello").run_id)
    assert names(quiet) == ["run"]
    Run.objects.filter(id=run.id).update(state=Run.State.SUCCEEDED)
    assert names(quiet) == []
    AgentTask.objects.create(run=run, goal="book a table", state=AgentTask.State.RUNNING)
    assert names(quiet) == ["delegation"]


def test_a_held_session_write_lock_blocks(quiet: dict[str, Any]) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("advisory locks are PostgreSQL's")
    dsn = {k: v for k, v in {
        "dbname": connection.settings_dict["NAME"], "host": connection.settings_dict.get("HOST") or None,
        "port": connection.settings_dict.get("PORT") or None, "user": connection.settings_dict.get("USER") or None,
        "password": connection.settings_dict.get("PASSWORD") or None,
    }.items() if v}
    with psycopg.connect(**dsn) as other:  # another session, writing memory for owner 7
        with other.transaction():
            other.execute("SELECT pg_advisory_xact_lock(%s, %s)", [MEMORY_LOCK_SPACE, 7])
            assert names(quiet) == ["session_write_lease"]
        assert names(quiet) == []


def test_a_running_phone_task_blocks(quiet: dict[str, Any]) -> None:
    task = quiet["data_dir"] / "packs" / "phone" / "tasks" / "t-1"
    task.mkdir(parents=True)
    (task / "terminal.json").write_text("{}")
    assert names(quiet) == []  # a finished task leaves no marker
    (task / "running").write_text("")
    blockers = idle.blockers(**quiet)
    assert [b.condition for b in blockers] == ["phone_task"] and "t-1" in blockers[0].detail


def test_a_fault_in_the_last_five_minutes_of_logs_blocks(quiet: dict[str, Any], settings: Any, tmp_path: Path) -> None:
    log = tmp_path / "yimi.log"
    now = 1_800_000_000.0
    lines = [
        {"ts": now - 400, "level": "error", "event": "run_failed"},  # older than 5 minutes
        {"ts": now - 10, "level": "info", "event": "run_done"},
        {"ts": now - 10, "level": "warning", "event": "frame_undelivered"},
    ]
    log.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    settings.YIMI_RELEASE_FAULT_LOGS = [str(log)]
    assert names(quiet, now=now) == []
    settings.YIMI_RELEASE_FAULT_EVENTS = ["frame_undelivered"]  # a fault rule by event name
    assert names(quiet, now=now) == ["fault_log"]
    settings.YIMI_RELEASE_FAULT_EVENTS = []
    with open(log, "a") as fh:
        fh.write(json.dumps({"ts": now - 299, "level": "critical", "event": "database_unreachable"}) + "\n")
    blockers = idle.blockers(**quiet, now=now)
    assert [b.condition for b in blockers] == ["fault_log"] and "database_unreachable" in blockers[0].detail
    assert names(quiet, now=now + 10) == []  # five minutes later it is history


def test_an_out_of_memory_kill_blocks_until_acknowledged(quiet: dict[str, Any], settings: Any) -> None:
    cgroups = Path("/sys/fs/cgroup/memory")
    if os.geteuid() != 0 or not (cgroups / "memory.oom_control").exists():
        pytest.skip("needs root and the cgroup v1 memory controller")
    group = cgroups / f"yimi-test-releases-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(32 << 20))
        if (group / "memory.memsw.limit_in_bytes").exists():
            (group / "memory.memsw.limit_in_bytes").write_text(str(32 << 20))
        settings.YIMI_RELEASE_OOM_FILES = [str(group / "memory.oom_control")]
        idle.acknowledge_oom(quiet["root"], idle.setting_paths("YIMI_RELEASE_OOM_FILES"))
        assert names(quiet) == []
        hog = subprocess.run(
            ["sh", "-c", f"echo $$ > {group}/cgroup.procs && exec {sys.executable} -c 'x = bytearray(256 << 20)'"]
        )
        assert hog.returncode == -9 or hog.returncode == 137  # killed by the kernel's OOM killer
        assert names(quiet) == ["out_of_memory"]
        idle.acknowledge_oom(quiet["root"], idle.setting_paths("YIMI_RELEASE_OOM_FILES"))  # a switch starts afresh
        assert names(quiet) == []
    finally:
        group.rmdir()


def test_wait_for_idle_names_every_blocker_and_returns_once_idle() -> None:
    clock = [0.0]
    seen: list[str] = []
    states = [[idle.Blocker("call", "1 call(s)"), idle.Blocker("run", "2 run(s)")], [idle.Blocker("run", "1 run(s)")], []]

    def check() -> list[idle.Blocker]:
        return states[0] if len(states) == 1 else states.pop(0)

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    idle.wait_for_idle(timeout=60, interval=5, clock=lambda: clock[0], sleep=sleep, progress=seen.append, check=check)
    assert clock[0] == 10 and seen == ["waiting for idle: call: 1 call(s); run: 2 run(s)", "waiting for idle: run: 1 run(s)"]

    clock[0] = 0.0
    with pytest.raises(YimiError) as busy:
        idle.wait_for_idle(timeout=12, interval=5, clock=lambda: clock[0], sleep=sleep, check=lambda: [idle.Blocker("phone_task", "1")])
    assert busy.value.code == "not_idle" and "phone_task" in busy.value.message and clock[0] == 15
