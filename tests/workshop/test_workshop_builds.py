"""Workshop builds (flow F4): build, self-test in the sandbox, back to the build step on
failure (the repair model, bounded attempts), and the registry candidate on success.

The repair model is the demo brain (the ``workshop_repair`` role falls back to ``brain``),
scripted to answer with a corrected adapter. Tests that ask it use a transactional database:
the client records each call's usage from another thread.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest

from capabilities.registry_models import PackCandidate
from tests.conftest import need, script
from tests.workshop.test_workshop_sandbox import usable
from tests.workshop.test_workshop_template import ADAPTER, SPEC
from workshop.builds import build_candidate, execute_build, start_build
from workshop.models import WorkshopBuild
from yimi_project.errors import YimiError

WRONG_ADAPTER = ADAPTER.replace("KM_PER_MILE = 1.609344", "KM_PER_MILE = 1.0")


@pytest.fixture(autouse=True)
def _workshop(settings: Any, tmp_path: Path) -> None:
    need(usable(), "the workshop sandbox (bubblewrap, writable cgroups) is needed")
    settings.YIMI_WORKSHOP_DIR = tmp_path / "workshop"
    settings.YIMI_PACK_REGISTRY_DIR = tmp_path / "registry"


def wrong_spec() -> dict[str, Any]:
    spec = copy.deepcopy(SPEC)
    spec["adapter"] = WRONG_ADAPTER
    return spec


@pytest.mark.django_db(transaction=True)
def test_a_failed_self_test_goes_back_to_the_build_step_and_the_repaired_build_is_a_candidate(
    brain: Any, tmp_path: Path, settings: Any
) -> None:
    script(brain, match="Self-test failure", reply=json.dumps({"adapter": ADAPTER}))
    source = tmp_path / "source"
    source.mkdir()
    (source / "build.json").write_text(json.dumps(wrong_spec()))
    said: list[str] = []
    candidate = build_candidate(source, progress=said.append)

    build = WorkshopBuild.objects.get()
    assert (build.state, build.attempts, build.error_code) == ("succeeded", 2, "")
    assert build.spec["adapter"] == ADAPTER  # the repaired spec is the one kept
    assert "PASS ten km" in build.log_tail
    assert (build.candidate_digest, build.candidate_state) == (candidate.digest, candidate.state)
    assert candidate.origin == "workshop" and candidate.name == "units" and candidate.built_against == ""
    assert candidate.state == "passed", (candidate.static_report, candidate.honesty_report)
    [request] = brain.script.requests  # one repair, between the two attempts
    failure = request["messages"][-1]["content"]
    assert "FAIL ten km" in failure and "KM_PER_MILE = 1.0" in failure
    assert said[:4] == [f"build {build.id}", "attempt 1/3: building", "attempt 1: self-test in the sandbox", "attempt 1: self-test failed"]
    assert "attempt 1: back to the build step (repair)" in said and "attempt 2: self-test passed; handing the pack to the registry" in said
    root = Path(settings.YIMI_WORKSHOP_DIR) / "builds" / str(build.id)
    assert sorted(p.name for p in root.iterdir()) == ["attempt-1", "attempt-2"]
    assert "KM_PER_MILE = 1.0" in (root / "attempt-1" / "units" / "server" / "tools.py").read_text()


@pytest.mark.django_db(transaction=True)
def test_attempts_are_bounded_and_the_build_fails_honestly(brain: Any) -> None:
    script(brain, match="Self-test failure", reply=json.dumps({"adapter": WRONG_ADAPTER + "\n# tried again\n"}))
    build = WorkshopBuild.objects.create(spec=wrong_spec(), max_attempts=2)
    build = execute_build(build.id)
    assert (build.state, build.attempts, build.error_code) == ("failed", 2, "selftest_failed")
    assert "FAIL ten km" in build.log_tail and build.candidate_digest == ""
    assert len(brain.script.requests) == 1  # no repair after the last attempt
    assert PackCandidate.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_an_unusable_repair_ends_the_build_with_its_code(brain: Any) -> None:
    script(brain, match="Self-test failure", reply="I think the factor is wrong.")
    build = execute_build(WorkshopBuild.objects.create(spec=wrong_spec()).id)
    assert (build.state, build.attempts, build.error_code) == ("failed", 1, "repair_unusable")


def test_a_claimed_build_is_not_run_twice(db: Any) -> None:
    build = WorkshopBuild.objects.create(spec=wrong_spec(), state=WorkshopBuild.State.BUILDING)
    assert execute_build(build.id).attempts == 0


def test_a_pack_draft_gets_one_attempt_and_nothing_to_repair(db: Any, tmp_path: Path) -> None:
    from workshop.drafts import fill_template

    draft = fill_template(wrong_spec(), tmp_path / "drafts")
    with pytest.raises(YimiError) as failed:
        build_candidate(draft)
    assert failed.value.code == "selftest_failed"
    build = WorkshopBuild.objects.get()
    assert (build.source, build.attempts, build.max_attempts) == (str(draft.resolve()), 1, 1)


def test_a_source_without_a_spec_or_a_draft_is_refused(db: Any, tmp_path: Path) -> None:
    with pytest.raises(YimiError) as refused:
        build_candidate(tmp_path)
    assert refused.value.code == "invalid_request"
    (tmp_path / "build.json").write_text(json.dumps({**SPEC, "tools": {"pay": {"effect": "spend"}}}))
    with pytest.raises(YimiError) as refused:
        build_candidate(tmp_path)
    assert refused.value.code == "invalid_spec"
    assert WorkshopBuild.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_start_build_runs_off_the_callers_path(settings: Any, brain: Any) -> None:
    settings.CELERY_BROKER_URL = None  # the embedded default: a thread of this process
    script(brain, match="Self-test failure", reply="not json")
    build = start_build(wrong_spec(), max_attempts=1)
    deadline = time.monotonic() + 120  # a bound on a broken build, not a speed requirement
    while WorkshopBuild.objects.get(id=build.id).state not in ("succeeded", "failed") and time.monotonic() < deadline:
        time.sleep(0.1)
    build.refresh_from_db()
    assert (build.state, build.attempts, build.error_code) == ("failed", 1, "selftest_failed")


def test_builds_are_listed_read_only_in_the_admin(client: Any, owner: Any) -> None:
    WorkshopBuild.objects.create(spec=wrong_spec(), state=WorkshopBuild.State.FAILED, error_code="selftest_failed")
    client.force_login(owner)
    page = client.get("/admin/workshop/workshopbuild/")
    assert page.status_code == 200
    assert "units" in page.content.decode() and "selftest_failed" in page.content.decode()
    assert client.get("/admin/workshop/workshopbuild/add/").status_code == 403
