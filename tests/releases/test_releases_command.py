"""``manage.py release build|gate|switch|rollback|status|cleanup`` end to end on a real
temporary repository, real release directories and a real service process; the
protected baseline on that path, with the owner's phone on the real device socket."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from releases import baseline
from releases.models import Release, ReleaseEvent
from releases.pointers import read_pointers
from releases.request_models import BaselineCard, RollbackRequest
from tests.conftest import db_async, open_socket, receive_until
from tests.support.ports import free_port
from tests.support.release_support import Repo, web_service

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


# --- the protected baseline on the release path (releases.baseline.check_release) ---------------------------

FIRST_FILES = {"tests/test_a.py": SUITE, "pytest.ini": "[pytest]\n", "payments/services.py": "FEE = 1\n", "docs/guide.md": "v1\n"}


def install_first(repo: Repo) -> Release:
    """The live version: built and switched in (a first install has no base, so nothing to protect yet)."""
    repo.commit("Version one", files=FIRST_FILES)
    release("build", "--repo", str(repo.path), "--venv", "shared")
    first = Release.objects.get()
    Release.objects.filter(id=first.id).update(state=Release.State.GATED)
    release("switch", first.build_id)
    return first


def candidate_of(first: Release) -> Release:
    return Release.objects.exclude(id=first.id).get()


def stages_checked(candidate: Release) -> list[tuple[str, str]]:
    events = ReleaseEvent.objects.filter(release=candidate, kind="baseline_check").order_by("at", "id")
    return [(e.details["stage"], e.reason) for e in events]


@pytest.mark.django_db(transaction=True)
async def test_a_candidate_changing_payments_is_switched_only_after_the_owners_signed_approval(
    host: dict[str, Any], owner: Any, make_device: Any
) -> None:
    repo: Repo = host["repo"]
    phone = await db_async(make_device)("phone")
    comm, _ = await open_socket(phone)
    first = await db_async(install_first)(repo)
    repo.commit("Payments show the shop's name", files={"payments/services.py": "FEE = 2\n"})

    out = await db_async(release)("build", "--repo", str(repo.path), "--venv", "shared")
    candidate = await db_async(candidate_of)(first)
    frame = await receive_until(comm, "release.card")  # on the owner's phone
    card = await db_async(lambda: BaselineCard.objects.select_related("release").get())()
    assert frame == {"type": "release.card", "card_id": str(card.id), "build_id": candidate.build_id,
                     "summary": "Payments show the shop's name", "areas": ["payments"], "paths": ["payments/services.py"]}
    assert card.release_id == candidate.id and card.state == "pending"
    assert "protected baseline: touches payments; a card waits for the owner's answer" in out

    out = await db_async(release)("gate", candidate.build_id, "--suite", "tests=tests")
    assert "passed: no new failures" in out and "waits for the owner's answer" in out
    with pytest.raises(CommandError) as waiting:
        await db_async(release)("switch", candidate.build_id)
    assert "(baseline_waiting)" in str(waiting.value)
    assert read_pointers(host["root"]).current_build == first.build_id
    assert await db_async(BaselineCard.objects.count)() == 1  # asked once, whatever the stage

    await comm.send_json_to({"type": "release.answer", "id": "a1", "card_id": str(card.id), "answer": "approve",
                             "signature": phone.sign(baseline.card_message(card, "approve"))})
    assert (await receive_until(comm, "release.result"))["state"] == "approved"
    out = await db_async(release)("switch", candidate.build_id)
    assert f"switched: {first.build_id} -> {candidate.build_id}" in out
    assert read_pointers(host["root"]).current_build == candidate.build_id
    assert await db_async(stages_checked)(candidate) == [
        ("build", "asking"), ("gate", "asking"), ("switch", "asking"), ("switch", "approved"),
    ]
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_signed_refusal_means_the_candidate_is_never_switched(host: dict[str, Any], owner: Any, make_device: Any) -> None:
    repo: Repo = host["repo"]
    phone = await db_async(make_device)("phone")
    comm, _ = await open_socket(phone)
    first = await db_async(install_first)(repo)
    repo.commit("Pay without asking", files={"payments/services.py": "FEE = 0\n", "docs/guide.md": "v2\n"})
    await db_async(release)("build", "--repo", str(repo.path), "--venv", "shared")
    candidate = await db_async(candidate_of)(first)
    frame = await receive_until(comm, "release.card")
    card = await db_async(lambda: BaselineCard.objects.select_related("release").get())()
    assert frame["card_id"] == str(card.id) and frame["paths"] == ["payments/services.py"]

    await comm.send_json_to({"type": "release.answer", "id": "r1", "card_id": str(card.id), "answer": "refuse",
                             "signature": phone.sign(baseline.card_message(card, "refuse"))})
    assert (await receive_until(comm, "release.result"))["state"] == "refused"
    for action in ("gate", "switch"):
        with pytest.raises(CommandError) as refused:
            await db_async(release)(action, candidate.build_id)
        assert "(baseline_refused)" in str(refused.value) and "payments" in str(refused.value)
    await db_async(candidate.refresh_from_db)()
    assert candidate.state == Release.State.REFUSED
    assert read_pointers(host["root"]).current_build == first.build_id
    await comm.disconnect()


def test_a_candidate_touching_nothing_protected_asks_nothing(host: dict[str, Any], owner: Any) -> None:
    repo: Repo = host["repo"]
    first = install_first(repo)
    repo.commit("The guide names the weekday", files={"docs/guide.md": "v2\n", "fix.txt": "x\n"})
    out = release("build", "--repo", str(repo.path), "--venv", "shared")
    candidate = candidate_of(first)
    out += release("gate", candidate.build_id, "--suite", "tests=tests")
    out += release("switch", candidate.build_id)
    assert f"switched: {first.build_id} -> {candidate.build_id}" in out
    assert out.count("protected baseline: not touched") == 3
    assert not BaselineCard.objects.exists() and not ReleaseEvent.objects.filter(kind="baseline_asked").exists()
    assert stages_checked(candidate) == [("build", "clear"), ("gate", "clear"), ("switch", "clear")]


def test_a_candidate_whose_base_cannot_be_read_does_not_go_on(host: dict[str, Any], owner: Any) -> None:
    repo: Repo = host["repo"]
    first = install_first(repo)
    repo.commit("elsewhere", files={"docs/guide.md": "v2\n"})
    release("build", "--repo", str(repo.path), "--venv", "shared")
    candidate = candidate_of(first)
    Release.objects.filter(id=candidate.id).update(state=Release.State.GATED)
    (Path(first.path) / "MANIFEST").chmod(0o644)
    (Path(first.path) / "MANIFEST").write_text(f"commit {first.commit}\n")  # the live MANIFEST is not its build's any more
    with pytest.raises(CommandError) as unreadable:
        release("switch", candidate.build_id)
    assert "(baseline_diff_failed)" in str(unreadable.value)
    assert read_pointers(host["root"]).current_build == first.build_id
