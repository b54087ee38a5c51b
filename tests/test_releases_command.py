"""``manage.py release build|gate|switch|rollback|status|cleanup`` end to end on a real
temporary repository, real release directories and a real service process."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from releases.models import Release
from releases.pointers import read_pointers
from releases.request_models import RollbackRequest
from tests.ports import free_port
from tests.release_support import Repo, web_service

pytestmark = pytest.mark.django_db

SUITE = "def test_ok():\n    assert True\n"


@pytest.fixture
def host(tmp_path: Path, settings: Any) -> dict[str, Any]:
    root = tmp_path / "releases"
    root.mkdir()
    settings.YIMI_RELEASES_ROOT = root
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    settings.YIMI_RELEASE_FAULT_LOGS = []
    settings.YIMI_RELEASE_OOM_FILES = []
    port = free_port()
    (root / "services.json").write_text(json.dumps([
        {"name": "web", "argv": ["{release}/venv/bin/python", "serve.py", str(port)], "health_url": f"http://127.0.0.1:{port}/healthz"},
    ]))
    repo = Repo(tmp_path / "repo")
    yield {"root": root, "repo": repo, "port": port}
    web_service(port, run_dir=root / "run").stop()  # the process the command started, through its pid file


def release(*args: str) -> str:
    out = io.StringIO()
    call_command("release", *args, stdout=out)
    return out.getvalue()


def test_build_gate_switch_status_rollback_cleanup(host: dict[str, Any], owner: Any) -> None:
    repo: Repo = host["repo"]
    repo.commit("Version one", files={"tests/test_a.py": SUITE, "pytest.ini": "[pytest]\n"})
    out = release("build", "--repo", str(repo.path), "--venv", "shared")
    assert "archiving" in out and "making the virtual environment" in out and out.count("built dir:") == 1
    first = Release.objects.get()
    assert first.base_commit == ""

    out = release("gate", first.build_id[4:16], "--suite", "tests=tests")
    assert "gating" in out and "no live release" in out and "passed: no new failures" in out

    out = release("switch", first.build_id)
    assert "re-checking the base" in out and "switched: (none) -> " + first.build_id in out and "backup:" in out
    assert read_pointers(host["root"]).current_build == first.build_id

    repo.commit("Replies arrive on the watch again", files={"fix.txt": "x\n"})
    release("build", "--repo", str(repo.path), "--venv", "shared")
    second = Release.objects.exclude(id=first.id).get()
    assert second.base_commit == first.commit
    with pytest.raises(CommandError) as not_gated:
        release("switch", Path(second.path).name)
    assert "release_not_gated" in str(not_gated.value)
    Release.objects.filter(id=second.id).update(state=Release.State.GATED)
    out = release("switch", Path(second.path).name)
    assert f"switched: {first.build_id} -> {second.build_id}" in out

    out = release("status")
    assert f"current   {second.build_id}" in out and f"previous  {first.build_id}" in out
    assert "idle: yes" in out and "switch" in out

    out = release("rollback", "--reason", "the owner said the new voice is worse")
    request = RollbackRequest.objects.get()
    assert request.state == "pending" and request.from_build == second.build_id and "queued" in out
    assert read_pointers(host["root"]).current_build == second.build_id  # queued, not done

    out = release("rollback", "--reason", "operator: back now", "--now")
    assert f"rolled_back: {second.build_id} -> {first.build_id}" in out and "database was not restored" in out

    repo.commit("a third")
    release("build", "--repo", str(repo.path), "--venv", "shared", "--base", first.commit)
    out = release("cleanup")
    assert "removed 1 release directory" in out
    assert Release.objects.filter(state=Release.State.REMOVED).count() == 1
    assert web_service(host["port"], run_dir=host["root"] / "run").build_id() == first.build_id


def test_bad_input_is_one_line_with_its_code(host: dict[str, Any]) -> None:
    with pytest.raises(CommandError) as unknown:
        release("switch", "dir:0000")
    assert "(not_found)" in str(unknown.value)
    with pytest.raises(CommandError) as bad_suite:
        host["repo"].commit("one")
        release("build", "--repo", str(host["repo"].path), "--venv", "shared")
        release("gate", Release.objects.get().build_id, "--suite", "no-arguments")
    assert "(invalid_request)" in str(bad_suite.value)
    with pytest.raises(CommandError) as bad_ref:
        release("build", "--repo", str(host["repo"].path), "--ref", "no-such-branch", "--venv", "shared")
    assert "(git_failed)" in str(bad_ref.value) or "(release_invalid)" in str(bad_ref.value)
    (host["root"] / "services.json").unlink()
    Release.objects.update(state=Release.State.GATED)
    with pytest.raises(CommandError) as no_services:
        release("switch", Release.objects.get().build_id)
    assert "(release_services_missing)" in str(no_services.value)
