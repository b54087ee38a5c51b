"""Directory releases: build ids, the current/previous pointers, switch with verify and
restore, rollback, cleanup, re-check of the base, the owner's system message, backup.

Real git repositories, real release directories with their own venv, real service
processes (a tiny HTTP server started from the release directory)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from llm import keyring
from memory.models import TimelineEntry
from releases import backup, builds, pointers, processes, switching
from releases.models import Release, ReleaseEvent
from releases.pointers import read_pointers
from tests.support.ports import free_port
from tests.support.release_support import Repo, quick_verify, web_service
from yimi_project.errors import YimiError

pytestmark = pytest.mark.django_db


@pytest.fixture
def root(tmp_path: Path, settings: Any) -> Path:
    settings.YIMI_RELEASES_ROOT = tmp_path / "releases"
    return tmp_path / "releases"


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path / "repo")


@pytest.fixture
def web() -> Any:
    service = web_service(free_port())
    yield service
    service.stop()


def build(repo: Repo, ref: str, root: Path, **kwargs: Any) -> Release:
    return builds.build_directory_release(repo.path, ref, root=root, make_venv=builds.shared_venv, **kwargs)


def no_backup() -> None:
    return None


def test_build_id_is_the_manifest_digest_and_the_same_commit_is_the_same_build(repo: Repo, root: Path) -> None:
    first = repo.commit("first")
    second = repo.commit("second", files={"extra.txt": "one byte more\n"})
    a = build(repo, first, root)
    again = build(repo, first, root)
    b = build(repo, second, root)
    assert a.build_id.startswith("dir:") and len(a.build_id) == 4 + 64
    assert again.id == a.id and again.build_id == a.build_id
    assert b.build_id != a.build_id and b.commit == second
    release = Path(a.path)
    assert (release / "code" / "serve.py").is_file() and (release / "venv" / "bin" / "python").exists()
    assert json.loads((release / "release.json").read_text())["build_id"] == a.build_id
    assert not (release / "code").stat().st_mode & 0o222 and not (release / "code" / "serve.py").stat().st_mode & 0o222
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == sorted([Path(a.path).name, Path(b.path).name])
    assert ReleaseEvent.objects.filter(kind="build").count() == 2


def test_switch_moves_current_to_previous_and_the_services_run_the_candidate(repo: Repo, root: Path, web: Any) -> None:
    a = build(repo, repo.commit("first"), root)
    b = build(repo, repo.commit("second"), root)
    calls: list[str] = []

    def take_backup() -> Path:
        calls.append("backup")
        assert web.build_id() in (None, a.build_id)  # taken before anything stops or moves
        return root / "backup-marker"

    first = pointers.switch(Path(a.path), services=[web], backup=take_backup, verify=quick_verify, root=root)
    assert first.ok and first.state == "switched" and first.from_build is None
    assert read_pointers(root).current_build == a.build_id and read_pointers(root).previous is None
    assert web.health() and web.build_id() == a.build_id

    second = pointers.switch(Path(b.path), services=[web], backup=take_backup, verify=quick_verify, root=root)
    now = read_pointers(root)
    assert second.ok and (now.current_build, now.previous_build) == (b.build_id, a.build_id)
    assert web.build_id() == b.build_id and calls == ["backup", "backup"]
    assert os.readlink(root / "current") == Path(b.path).name  # relative symlinks
    assert [r["kind"] for r in pointers.read_history(root)] == ["switch", "switch"]
    assert list(ReleaseEvent.objects.filter(kind="switch").values_list("from_build", "to_build").order_by("id")) == [
        ("", a.build_id), (a.build_id, b.build_id),
    ]
    with pytest.raises(YimiError) as again:
        pointers.switch(Path(b.path), services=[web], backup=take_backup, verify=quick_verify, root=root)
    assert again.value.code == "already_current"


def test_switch_verify_failure_restores_the_previous_pointers_and_services(repo: Repo, root: Path, web: Any) -> None:
    a = build(repo, repo.commit("first"), root)
    b = build(repo, repo.commit("second"), root)
    broken = build(repo, repo.commit("broken", healthy=False), root)
    for release in (a, b):
        assert pointers.switch(Path(release.path), services=[web], backup=no_backup, verify=quick_verify, root=root).ok

    result = pointers.switch(Path(broken.path), services=[web], backup=no_backup, verify=quick_verify, root=root)

    assert not result.ok and result.state == "restored"
    assert result.problems == ["web: not healthy"] and result.restore_problems == []
    now = read_pointers(root)
    assert (now.current_build, now.previous_build) == (b.build_id, a.build_id)
    assert web.health() and web.build_id() == b.build_id
    failed = ReleaseEvent.objects.get(kind="switch_failed")
    assert failed.to_build == broken.build_id and failed.details["restored"] is True


def test_a_failed_backup_moves_nothing(repo: Repo, root: Path, web: Any) -> None:
    a = build(repo, repo.commit("first"), root)
    b = build(repo, repo.commit("second"), root)
    pointers.switch(Path(a.path), services=[web], backup=no_backup, verify=quick_verify, root=root)

    def failing() -> Path:
        raise OSError("disk full")

    result = pointers.switch(Path(b.path), services=[web], backup=failing, verify=quick_verify, root=root)
    assert result.state == "backup_failed" and "disk full" in result.problems[0]
    assert read_pointers(root).current_build == a.build_id and web.build_id() == a.build_id


def test_rollback_to_previous_swaps_the_pointers_once_and_checks_the_expected_current(repo: Repo, root: Path, web: Any) -> None:
    a = build(repo, repo.commit("first"), root)
    b = build(repo, repo.commit("second"), root)
    for release in (a, b):
        pointers.switch(Path(release.path), services=[web], backup=no_backup, verify=quick_verify, root=root)
    seen: list[str | None] = []

    with pytest.raises(YimiError) as stale:
        pointers.rollback_to_previous("not this one", services=[web], verify=quick_verify, root=root, expected_current=a.build_id)
    assert stale.value.code == "current_changed" and read_pointers(root).current_build == b.build_id

    result = pointers.rollback_to_previous(
        "the owner does not want it", services=[web], verify=quick_verify, root=root,
        expected_current=b.build_id, before_switch=lambda p: seen.append(p.current_build),
    )
    assert result.ok and result.state == "rolled_back" and seen == [b.build_id]
    now = read_pointers(root)
    assert (now.current_build, now.previous_build) == (a.build_id, b.build_id)
    assert web.build_id() == a.build_id
    event = ReleaseEvent.objects.get(kind="rollback")
    assert (event.from_build, event.to_build, event.reason) == (b.build_id, a.build_id, "the owner does not want it")


def test_a_switch_that_lost_the_race_or_names_a_foreign_directory_moves_nothing(repo: Repo, root: Path, web: Any, tmp_path: Path) -> None:
    a = build(repo, repo.commit("first"), root)
    b = build(repo, repo.commit("second"), root)
    pointers.switch(Path(a.path), services=[web], backup=no_backup, verify=quick_verify, root=root)
    backups: list[int] = []

    def counted() -> None:
        backups.append(1)

    with pytest.raises(YimiError) as lost:  # another release took over since the re-check saw "none"
        pointers.switch(Path(b.path), services=[web], backup=counted, verify=quick_verify, root=root, expected_current=None)
    assert lost.value.code == "current_changed"
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(a.path, elsewhere / "copy", symlinks=True)
    with pytest.raises(YimiError) as foreign:
        pointers.switch(elsewhere / "copy", services=[web], backup=counted, verify=quick_verify, root=root)
    assert foreign.value.code == "release_invalid"
    assert backups == [] and read_pointers(root).current_build == a.build_id and web.build_id() == a.build_id


def test_rollback_without_previous_is_refused(repo: Repo, root: Path, web: Any) -> None:
    a = build(repo, repo.commit("first"), root)
    pointers.switch(Path(a.path), services=[web], backup=no_backup, verify=quick_verify, root=root)
    with pytest.raises(YimiError) as refused:
        pointers.rollback_to_previous("why", services=[web], root=root)
    assert refused.value.code == "no_previous_release"


def test_cleanup_keeps_only_current_and_previous(repo: Repo, root: Path, web: Any) -> None:
    made = [build(repo, repo.commit(f"commit {i}"), root) for i in range(3)]
    for release in made[1:]:
        pointers.switch(Path(release.path), services=[web], backup=no_backup, verify=quick_verify, root=root)
    (root / ".build-interrupted" / "code").mkdir(parents=True)
    (root / "not-a-release").mkdir()

    removed = builds.cleanup(root)

    assert removed == [".build-interrupted", Path(made[0].path).name]
    left = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    assert left == sorted([Path(made[1].path).name, Path(made[2].path).name, "not-a-release"])
    assert Release.objects.get(id=made[0].id).state == Release.State.REMOVED
    assert read_pointers(root).current_build == made[2].build_id and read_pointers(root).previous_build == made[1].build_id


def gated(release: Release) -> Release:
    Release.objects.filter(id=release.id).update(state=Release.State.GATED)
    release.refresh_from_db()
    return release


def test_a_candidate_whose_base_is_not_the_live_commit_is_void(repo: Repo, root: Path, web: Any) -> None:
    first = repo.commit("first")
    a = build(repo, first, root)
    pointers.switch(Path(a.path), services=[web], backup=no_backup, verify=quick_verify, root=root)
    second = repo.commit("second")
    candidate = gated(build(repo, repo.commit("fix on second"), root, base_commit=second))

    with pytest.raises(YimiError) as void:
        switching.switch_release(candidate, services=[web], root=root, idle_check=lambda: [], backup=no_backup, verify=quick_verify)

    assert void.value.code == "release_void" and first[:12] in str(void.value.message)
    candidate.refresh_from_db()
    assert candidate.state == Release.State.VOID and "rebuild" in candidate.state_reason
    assert read_pointers(root).current_build == a.build_id and web.build_id() == a.build_id


def test_switch_release_tells_the_owner_the_fix_line_and_a_failed_one_is_failed(repo: Repo, root: Path, web: Any, owner: Any) -> None:
    a = build(repo, repo.commit("first"), root)
    pointers.switch(Path(a.path), services=[web], backup=no_backup, verify=quick_verify, root=root)
    long_line = "Replies no longer stop after a long pause " + "x" * 300
    fix = gated(build(repo, repo.commit(long_line + "\n\nThe details for engineers."), root))

    result = switching.switch_release(fix, services=[web], root=root, idle_check=lambda: [], backup=no_backup, verify=quick_verify)

    assert result.ok
    fix.refresh_from_db()
    assert fix.state == Release.State.SWITCHED and fix.switched_at is not None
    notice = TimelineEntry.objects.get(owner=owner, notice_code="release")
    assert notice.kind == "notice" and notice.text.startswith("Yimi was updated: Replies no longer stop after a long pause")
    assert len(fix.fix_line) == 200 and fix.fix_line.endswith("…") and "engineers" not in notice.text

    broken = gated(build(repo, repo.commit("Break it", healthy=False), root))
    failed = switching.switch_release(broken, services=[web], root=root, idle_check=lambda: [], backup=no_backup, verify=quick_verify)
    broken.refresh_from_db()
    assert failed.state == "restored" and broken.state == Release.State.FAILED
    assert TimelineEntry.objects.filter(notice_code="release").count() == 1  # nothing told for a switch that did not take


def test_switch_release_waits_for_idle_and_moves_nothing_while_blocked(repo: Repo, root: Path, web: Any) -> None:
    from releases.idle import Blocker

    a = build(repo, repo.commit("first"), root)
    pointers.switch(Path(a.path), services=[web], backup=no_backup, verify=quick_verify, root=root)
    candidate = gated(build(repo, repo.commit("second"), root))
    with pytest.raises(YimiError) as busy:
        switching.switch_release(
            candidate, services=[web], root=root, idle_check=lambda: [Blocker("call", "1 call(s) not hung up")],
            backup=no_backup, verify=quick_verify, idle_timeout=0,
        )
    assert busy.value.code == "not_idle" and "call" in busy.value.message
    assert read_pointers(root).current_build == a.build_id


def test_backup_holds_the_database_and_the_model_settings_master_key(tmp_path: Path, settings: Any) -> None:
    settings.DATA_DIR = tmp_path / "data"
    settings.SECRETS_DIR = tmp_path / "secrets"
    settings.DATA_DIR.mkdir()
    keyring.ensure_master_key()
    folder = backup.backup_now(tmp_path / "backups")
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    assert manifest["master_key"] is True
    assert (folder / "model_master_key").read_bytes() == keyring.master_key_path().read_bytes()
    assert oct((folder / "model_master_key").stat().st_mode & 0o777) == "0o600"
    dump = folder / ("db.dump" if manifest["database"] == "postgresql" else "db.sqlite3")
    assert dump.stat().st_size > 0 and manifest["files"][dump.name]["bytes"] == dump.stat().st_size
    if manifest["database"] == "postgresql":
        listing = subprocess.run(["pg_restore", "--list", str(dump)], capture_output=True, text=True, check=True).stdout
        assert "releases_release" in listing and "brain_modelrole" in listing


def test_the_owner_sees_releases_and_their_history_read_only(repo: Repo, root: Path, owner: Any, client: Any, django_user_model: Any) -> None:
    a = build(repo, repo.commit("The first version"), root)
    client.force_login(owner)
    listing = client.get("/admin/releases/release/")
    assert listing.status_code == 200 and a.build_id[:20] in listing.content.decode()
    page = client.get(f"/admin/releases/release/{a.id}/change/")
    assert page.status_code == 200 and "The first version" in page.content.decode() and "build" in page.content.decode()
    assert 'name="_save"' not in page.content.decode()  # nothing to save: read-only
    assert client.get("/admin/releases/releaseevent/").status_code == 200
    assert client.post(f"/admin/releases/release/{a.id}/delete/", {"post": "yes"}).status_code == 403
    assert Release.objects.filter(id=a.id).exists()
    other = django_user_model.objects.create_user("staff", password="x" * 12, is_staff=True, is_superuser=True)
    client.force_login(other)
    assert client.get("/admin/releases/release/").status_code == 403


def test_health_reports_the_build_of_the_release_directory_it_runs_from(tmp_path: Path, settings: Any, owner: Any) -> None:
    from django.test import Client

    from yimi_project import views

    release = tmp_path / "abc-123"
    (release / "code").mkdir(parents=True)
    pointers.ReleaseDir(path=release, build_id="dir:" + "a" * 64, commit="c" * 40).write()
    settings.BASE_DIR = release / "code"
    views.running_build.cache_clear()
    try:
        assert Client(REMOTE_ADDR="127.0.0.1").get("/api/health/").json()["build"] == "dir:" + "a" * 64
        assert Client(REMOTE_ADDR="203.0.113.9").get("/api/health/").json() == {"status": "ok"}  # not told to the public
        settings.BASE_DIR = tmp_path / "checkout"
        views.running_build.cache_clear()
        assert Client(REMOTE_ADDR="127.0.0.1").get("/api/health/").json()["build"] is None  # not a release directory
    finally:
        views.running_build.cache_clear()


DATA_DIR_PROBE = """\
import http.server, json, os, sys


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"status": "ok", "data_dir": os.environ.get("YIMI_DATA_DIR")}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_services_run_on_the_commands_data_directory_unless_services_json_names_one(
    tmp_path: Path, root: Path, settings: Any
) -> None:
    settings.DATA_DIR = tmp_path / "live-data"  # not in this process's environment: the settings' value is passed on
    release = tmp_path / "release"
    (release / "code").mkdir(parents=True)
    (release / "code" / "probe.py").write_text(DATA_DIR_PROBE)
    ports = {"web": free_port(), "elsewhere": free_port()}
    root.mkdir()
    (root / "services.json").write_text(json.dumps([
        {"name": "web", "argv": [sys.executable, "probe.py", str(ports["web"])], "health_url": f"http://127.0.0.1:{ports['web']}/"},
        {"name": "elsewhere", "argv": [sys.executable, "probe.py", str(ports["elsewhere"])],
         "health_url": f"http://127.0.0.1:{ports['elsewhere']}/", "env": {"YIMI_DATA_DIR": str(tmp_path / "other-data")}},
    ]))  # fmt: skip
    services = processes.load_services(root)
    try:
        told = {}
        for service in services:
            service.start(release)
            with urllib.request.urlopen(service.health_url, timeout=5) as answer:
                told[service.name] = json.load(answer)["data_dir"]
    finally:
        for service in services:
            service.stop()

    assert told == {"web": str(tmp_path / "live-data"), "elsewhere": str(tmp_path / "other-data")}
