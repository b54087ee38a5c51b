"""Rollback on request (flow F6), memory across a rollback, and the protected baseline
(flow F5): real release directories and pointers under a temporary releases root, real
git repositories for the candidate's diff, PostgreSQL for the rows and memory."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from memory.assertions import store as assertions
from memory.assertions.projections import render
from memory.models import Assertion, TimelineEntry
from releases import baseline, idle, memory_bridge, pointers, requested
from releases.models import Release, ReleaseEvent
from releases.request_models import BaselineCard, RollbackRequest
from yimi_project.errors import YimiError


@dataclass
class RecordingService:
    """A service that runs whatever release it was last started on (``pointers.Service``)."""

    name: str = "web"
    release: Path | None = None
    starts: list[str] = field(default_factory=list)

    def start(self, release: Path) -> None:
        self.release = release
        self.starts.append(release.name)

    def stop(self) -> None:
        self.release = None

    def health(self) -> bool:
        return self.release is not None

    def build_id(self) -> str | None:
        return pointers.ReleaseDir.read(self.release).build_id if self.release else None


def make_release(root: Path, name: str) -> pointers.ReleaseDir:
    path = root / name
    path.mkdir(parents=True)
    release = pointers.ReleaseDir(path=path.resolve(), build_id=f"dir:{name}", commit=name * 8)
    release.write()
    return release


@pytest.fixture
def host(tmp_path: Path) -> Any:
    """A host that switched from A to B: current B, previous A, the switch in its history."""
    root = (tmp_path / "releases").resolve()
    root.mkdir()
    a, b = make_release(root, "a"), make_release(root, "b")
    pointers.set_pointer(root, pointers.PREVIOUS, a)
    pointers.set_pointer(root, pointers.CURRENT, b)
    pointers.append_history(root, "switch", {"from_build": a.build_id, "to_build": b.build_id})
    return root


def note(owner: Any, text: str, key: str) -> None:
    assertions.commit(assertions.CommitRequest(
        owner_id=owner.id, request_id=key, predicate=assertions.CORE_PROFILE,
        payload={"text": text, "doc": "memory"}, expected_version=0,
    ))


def memory_entries(owner: Any) -> list[str]:
    from memory.assertions import core_import

    return core_import.parse_entries(render(owner.id)["MEMORY.md"])


# --- rollback on request ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_requested_rollback_is_executed_at_idle(owner: Any, host: Path) -> None:
    note(owner, "likes green tea", "n1")
    service = RecordingService()
    request = requested.request_rollback(owner, "这个版本说话太啰嗦了，改回去", root=host)
    assert request.state == "pending" and request.from_build == "dir:b"
    assert requested.request_rollback(owner, "again", root=host).id == request.id  # one waits at a time

    [outcome] = requested.execute_pending(idle_check=list, services=[service], root=host)
    assert outcome.state == "executed"
    ptrs = pointers.read_pointers(host)
    assert (ptrs.current_build, ptrs.previous_build) == ("dir:a", "dir:b")
    assert service.build_id() == "dir:a"
    request.refresh_from_db()
    assert request.state == "executed" and request.to_build == "dir:a"
    notice = TimelineEntry.objects.get(id=request.notice_id)
    assert notice.kind == "notice" and "改回去" in notice.text and "database was not restored" in notice.text
    # the core memory was projected for the old version before the switch
    assert "likes green tea" in (host / "a" / "memory" / "MEMORY.md").read_text()
    assert ReleaseEvent.objects.filter(kind="rollback", to_build="dir:a").exists()
    # nothing left to do: a second run does nothing
    assert requested.execute_pending(idle_check=list, services=[service], root=host) == []


@pytest.mark.django_db
def test_requested_rollback_waits_while_busy(owner: Any, host: Path, tmp_path: Path) -> None:
    request = requested.request_rollback(owner, "I don't want this version", root=host)
    data_dir = tmp_path / "data"
    marker = data_dir / "packs" / "phone" / "tasks" / "t1" / "running"  # a phone errand in progress
    marker.parent.mkdir(parents=True)
    marker.write_text("")
    check = partial(idle.blockers, root=host, data_dir=data_dir)
    assert [b.condition for b in check()] == ["phone_task"]
    assert requested.execute_pending(idle_check=check, services=[RecordingService()], root=host) == []
    request.refresh_from_db()
    assert request.state == "pending"
    assert pointers.read_pointers(host).current_build == "dir:b"
    marker.unlink()  # the errand ended: the next idle moment executes it
    [outcome] = requested.execute_pending(idle_check=check, services=[RecordingService()], root=host)
    assert outcome.state == "executed" and pointers.read_pointers(host).current_build == "dir:a"


@pytest.mark.django_db
def test_requested_rollback_refused_when_current_is_not_the_latest_switch(owner: Any, host: Path) -> None:
    service = RecordingService()
    first = requested.request_rollback(owner, "go back", root=host)
    requested.execute_pending(idle_check=list, services=[service], root=host)
    first.refresh_from_db()
    assert first.state == "executed"
    # said twice: now A runs, but B was the latest switch; going back again would re-install B
    second = requested.request_rollback(owner, "go back", root=host)
    assert second.id != first.id and second.from_build == "dir:a"
    [outcome] = requested.execute_pending(idle_check=list, services=[service], root=host)
    assert outcome.state == "refused" and "not the one most recently switched in" in outcome.detail
    assert pointers.read_pointers(host).current_build == "dir:a"
    second.refresh_from_db()
    assert second.state == "refused"
    assert "was not carried out" in TimelineEntry.objects.get(id=second.notice_id).text


@pytest.mark.django_db
def test_requested_rollback_refused_when_a_newer_release_came_meanwhile(owner: Any, host: Path) -> None:
    request = requested.request_rollback(owner, "go back", root=host)
    c = make_release(host, "c")
    pointers.switch(c, services=[RecordingService()], backup=lambda: None, root=host, journal=None)
    [outcome] = requested.execute_pending(idle_check=list, services=[RecordingService()], root=host)
    assert outcome.state == "refused" and "changed since you asked" in outcome.detail
    assert pointers.read_pointers(host).current_build == "dir:c"
    request.refresh_from_db()
    assert request.state == "refused"


@pytest.mark.django_db
def test_only_the_owner_asks_and_with_a_reason(owner: Any, host: Path, django_user_model: Any) -> None:
    other = django_user_model.objects.create_user("staff", password="x" * 12, is_staff=True, is_superuser=True)
    with pytest.raises(YimiError) as err:
        requested.request_rollback(other, "go back", root=host)
    assert err.value.code == "forbidden"
    with pytest.raises(YimiError) as err:
        requested.request_rollback(owner, "   ", root=host)
    assert err.value.code == "invalid_request"
    assert not RollbackRequest.objects.exists()


# --- memory across a rollback -----------------------------------------------------------------------


@pytest.mark.django_db
def test_entries_added_on_the_old_version_are_imported_once(owner: Any, tmp_path: Path) -> None:
    note(owner, "likes green tea", "n1")
    note(owner, "sister is called Mei", "n2")
    old = tmp_path / "a"
    memory_bridge.project_for(old, owner.id)
    # the old version runs and writes two more entries into its memory file
    path = old / "memory" / "MEMORY.md"
    path.write_text(path.read_text() + "§\nmoved to Hangzhou\n§\nallergic to peanuts\n")

    reports = memory_bridge.import_added_meanwhile(old, owner.id)
    assert len(reports["memory"].imported) == 2
    assert sorted(memory_entries(owner)) == sorted(["likes green tea", "sister is called Mei", "moved to Hangzhou", "allergic to peanuts"])
    again = memory_bridge.import_added_meanwhile(old, owner.id)  # upgrading twice, or a retry
    assert again["memory"].imported == [] and again["memory"].already == 2
    assert Assertion.objects.filter(owner=owner, predicate=assertions.CORE_PROFILE).count() == 4


@pytest.mark.django_db
def test_a_release_never_projected_for_brings_nothing_back(owner: Any, tmp_path: Path) -> None:
    assert memory_bridge.import_added_meanwhile(tmp_path / "never", owner.id) == {}


# --- the protected baseline -------------------------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    for path in ("payments/services.py", "docs/guide.md", "memory/recall.py"):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text("v1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "base")
    return repo


def candidate(repo: Path, *paths: str) -> tuple[str, str]:
    base = git(repo, "rev-parse", "HEAD")
    for path in paths:
        (repo / path).write_text("v2\n")
    git(repo, "commit", "-q", "-am", "Replies no longer repeat the last sentence")
    return base, git(repo, "rev-parse", "HEAD")


def record(commit: str, base: str) -> Release:
    return Release.objects.create(build_id=f"dir:{commit[:12]}", kind="directory", commit=commit, base_commit=base,
                                  fix_line="Replies no longer repeat the last sentence", state="gated", created_at=timezone.now())


@pytest.mark.django_db
def test_a_diff_touching_payments_requires_the_card(owner: Any, repo: Path) -> None:
    base, commit = candidate(repo, "payments/services.py", "docs/guide.md")
    release = record(commit, base)
    verdict = baseline.check(release, baseline.changed_paths(repo, base, commit), owner_id=owner.id)
    assert verdict.kind == "asking" and verdict.touched.areas == ["payments"]
    assert verdict.touched.paths == ["payments/services.py"]
    with pytest.raises(YimiError) as err:
        baseline.require_clear(release)
    assert err.value.code == "baseline_waiting"
    # asked once: checking again is the same card
    again = baseline.check(release, baseline.changed_paths(repo, base, commit), owner_id=owner.id)
    assert again.card.id == verdict.card.id and BaselineCard.objects.count() == 1
    baseline.answer_in_console(owner.id, verdict.card.id, "approve")
    assert baseline.check(release, ["payments/services.py"], owner_id=owner.id).kind == "approved"
    baseline.require_clear(release)  # goes on


@pytest.mark.django_db
def test_an_untouched_diff_asks_nothing(owner: Any, repo: Path) -> None:
    base, commit = candidate(repo, "docs/guide.md", "memory/recall.py")
    release = record(commit, base)
    verdict = baseline.check(release, baseline.changed_paths(repo, base, commit), owner_id=owner.id)
    assert verdict.kind == "clear" and not BaselineCard.objects.exists()
    baseline.require_clear(release)


@pytest.mark.django_db
def test_refusal_ends_the_candidate_honestly(owner: Any, repo: Path, make_device: Any) -> None:
    base, commit = candidate(repo, "payments/services.py")
    release = record(commit, base)
    card = baseline.check(release, baseline.changed_paths(repo, base, commit), owner_id=owner.id).card
    phone = make_device("phone")
    with pytest.raises(YimiError) as err:  # signed over another answer: nothing changes
        baseline.answer_card(phone.device, card.id, "refuse", phone.sign(baseline.card_message(card, "approve")))
    assert err.value.code == "bad_signature"
    answered = baseline.answer_card(phone.device, card.id, "refuse", phone.sign(baseline.card_message(card, "refuse")))
    assert answered.state == "refused" and answered.answered_via == "device"
    release.refresh_from_db()
    assert release.state == "refused" and "protected baseline" in release.state_reason
    with pytest.raises(YimiError) as err:
        baseline.require_clear(release)
    assert err.value.code == "baseline_refused"
    with pytest.raises(YimiError) as err:  # a second answer finds it closed
        baseline.answer_in_console(owner.id, card.id, "approve")
    assert err.value.code == "card_closed"
    assert baseline.check(release, ["payments/services.py"], owner_id=owner.id).kind == "refused"
    assert BaselineCard.objects.count() == 1


@pytest.mark.django_db
def test_a_rollback_never_goes_back_to_a_version_whose_card_was_refused_or_is_unanswered(owner: Any, host: Path) -> None:
    from releases import switching

    previous = Release.objects.create(build_id="dir:a", kind="directory", commit="a" * 40, state="refused", created_at=timezone.now())
    card = BaselineCard.objects.create(owner=owner, release=previous, areas=["payments"], paths=["payments/services.py"],
                                       state="refused", created_at=timezone.now())
    for state, code in (("refused", "baseline_refused"), ("pending", "baseline_waiting")):
        BaselineCard.objects.filter(id=card.id).update(state=state)
        with pytest.raises(YimiError) as asked:
            requested.request_rollback(owner, "go back", root=host)
        assert asked.value.code == code and "payments" in asked.value.message
        with pytest.raises(YimiError) as now:
            switching.rollback_release("the operator went back", services=[RecordingService()], root=host)
        assert now.value.code == code
    assert not RollbackRequest.objects.exists() and pointers.read_pointers(host).current_build == "dir:b"

    BaselineCard.objects.filter(id=card.id).update(state="approved")
    request = requested.request_rollback(owner, "go back", root=host)
    BaselineCard.objects.filter(id=card.id).update(state="refused")  # checked again when it runs
    [outcome] = requested.execute_pending(idle_check=list, services=[RecordingService()], root=host)
    assert outcome.state == "refused" and "the owner refused" in outcome.detail
    request.refresh_from_db()
    assert request.state == "refused" and pointers.read_pointers(host).current_build == "dir:b"


def test_the_protected_list_matches_files_and_directories() -> None:
    touched = baseline.protected_areas(["./consent/services.py", "packs/owner-mac/server/main.py", "releases/watchdog.py",
                                        "paymentsx/a.py", "docs/architecture.md"])
    assert touched.areas == ["first-send consent", "Mac remote access", "release and rollback"]
    assert "paymentsx/a.py" not in touched.paths
    repo_root = Path(__file__).resolve().parents[2]
    for area, entries in baseline.PROTECTED_BASELINE.items():  # every entry names something that exists
        for entry in entries:
            assert (repo_root / entry).exists(), f"{area}: {entry} is not in the repository"


def test_the_beat_runs_the_rollback_requests_task() -> None:
    from django.conf import settings

    from yimi_project.celery import app

    app.loader.import_default_modules()
    entry = settings.CELERY_BEAT_SCHEDULE["execute-rollback-requests"]
    assert entry["task"] in app.tasks


@pytest.mark.django_db
def test_the_task_does_nothing_without_a_request(settings: Any, tmp_path: Path) -> None:
    from releases.tasks import execute_rollback_requests

    settings.YIMI_RELEASES_ROOT = str(tmp_path / "no-root")  # no services.json: never read without a request
    assert execute_rollback_requests() == 0


# --- the console --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_owner_asks_for_a_rollback_in_the_console(owner: Any, host: Path, client: Any, settings: Any,
                                                      django_user_model: Any) -> None:
    settings.YIMI_RELEASES_ROOT = str(host)
    client.force_login(owner)
    page = client.get("/admin/releases/rollbackrequest/add/")
    assert page.status_code == 200 and "database is not restored" in page.content.decode()
    response = client.post("/admin/releases/rollbackrequest/add/", {"reason": "回复太慢了，不要这个版本"})
    assert response.status_code == 302
    request = RollbackRequest.objects.get()
    assert request.reason == "回复太慢了，不要这个版本" and request.from_build == "dir:b" and request.state == "pending"
    assert ReleaseEvent.objects.filter(kind="rollback_requested").count() == 1
    # another superuser sees nothing and cannot ask
    other = django_user_model.objects.create_user("staff", password="x" * 12, is_staff=True, is_superuser=True)
    client.force_login(other)
    assert client.post("/admin/releases/rollbackrequest/add/", {"reason": "no"}).status_code == 403
    assert RollbackRequest.objects.count() == 1


@pytest.mark.django_db
def test_the_owner_refuses_a_baseline_card_in_the_console(owner: Any, client: Any) -> None:
    release = Release.objects.create(build_id="dir:x", kind="directory", commit="x" * 40, state="gated", created_at=timezone.now())
    card = baseline.check(release, ["consent/services.py"], owner_id=owner.id).card
    client.force_login(owner)
    response = client.post("/admin/releases/baselinecard/", {"action": "refuse", "_selected_action": [str(card.id)]})
    assert response.status_code == 302
    card.refresh_from_db()
    release.refresh_from_db()
    assert card.state == "refused" and card.answered_via == "console" and release.state == "refused"


@pytest.mark.django_db
def test_an_operator_rollback_projects_the_core_memory_first(owner: Any, host: Path) -> None:
    from releases import switching

    note(owner, "likes green tea", "n1")
    result = switching.rollback_release("the operator went back", services=[RecordingService()], root=host)
    assert result.ok and pointers.read_pointers(host).current_build == "dir:a"
    assert "likes green tea" in (host / "a" / "memory" / "MEMORY.md").read_text()


@pytest.mark.django_db
def test_a_request_whose_executor_died_ends_failed_and_is_not_run_again(owner: Any, host: Path) -> None:
    from datetime import timedelta

    request = requested.request_rollback(owner, "go back", root=host)
    claimed_at = timezone.now() - timedelta(minutes=16)
    RollbackRequest.objects.filter(id=request.id).update(state="executing", claimed_at=claimed_at)  # a worker took it and died
    assert requested.execute_pending(idle_check=list, services=[RecordingService()], root=host) == []
    request.refresh_from_db()
    assert request.state == "failed" and "interrupted" in request.state_reason
    assert pointers.read_pointers(host).current_build == "dir:b"
    assert "did not work" in TimelineEntry.objects.get(id=request.notice_id).text
