"""The candidate gate: F_cand minus F_base must be empty; an unparsable non-zero exit is a
failure. Tiny generated pytest suites run for real in bubblewrap (offline, read-only root)
from real release directories with their own venv."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from releases import builds, gate
from releases.gate import Suite, SuiteRun
from releases.models import Release, ReleaseEvent
from releases.pointers import ReleaseDir
from tests.release_support import Repo

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

PASSING = "def test_ok():\n    assert True\n"
KNOWN_FAILURE = "def test_known_broken():\n    assert 1 == 2\n"
NEW_FAILURE = "def test_new_broken():\n    assert 'a' == 'b'\n"
CRASH = "import os\n\n\ndef pytest_configure(config):\n    os._exit(3)  # dies before any report is written\n"
SANDBOX_PROBE = '''\
import pathlib
import socket

import pytest


def test_no_network():
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", 5432), timeout=2)


def test_read_only_root():
    with pytest.raises(OSError):
        (pathlib.Path.cwd() / "written-by-a-test").write_text("x")
'''


# The tiny suites need none of the installed pytest plugins (pytest-django, asyncio…).
QUICK = (("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1"),)
SUITES = (Suite("tests", ("tests",), QUICK),)


@pytest.fixture
def root(tmp_path: Path, settings: Any) -> Path:
    settings.YIMI_RELEASES_ROOT = tmp_path / "releases"
    return tmp_path / "releases"


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path / "repo")


def release_with(repo: Repo, root: Path, files: dict[str, str], message: str = "a commit") -> Release:
    for stale in (repo.path / "tests").glob("*.py") if (repo.path / "tests").is_dir() else []:
        stale.unlink()
    commit = repo.commit(message, files={"pytest.ini": "[pytest]\n", **files})
    return builds.build_directory_release(repo.path, commit, root=root, make_venv=builds.shared_venv)


def test_a_new_failure_rejects_the_candidate(repo: Repo, root: Path) -> None:
    base = release_with(repo, root, {"tests/test_a.py": PASSING + KNOWN_FAILURE})
    candidate = release_with(repo, root, {"tests/test_a.py": PASSING + KNOWN_FAILURE + NEW_FAILURE})

    result = gate.run_gate(candidate, ReleaseDir.read(Path(base.path)), suites=SUITES)

    assert not result.passed
    assert result.new_failures == ["tests::tests.test_a::test_new_broken"]
    assert result.base_failures == ["tests::tests.test_a::test_known_broken"]
    candidate.refresh_from_db()
    assert candidate.state == Release.State.REJECTED and "1 new failure" in candidate.state_reason
    assert candidate.gate_result["new_failures"] == result.new_failures
    assert ReleaseEvent.objects.get(kind="gate", release=candidate).details["passed"] is False


def test_a_failure_the_base_has_too_passes(repo: Repo, root: Path) -> None:
    base = release_with(repo, root, {"tests/test_a.py": PASSING + KNOWN_FAILURE})
    candidate = release_with(repo, root, {"tests/test_a.py": PASSING + KNOWN_FAILURE, "fix.txt": "the fix\n"})

    result = gate.run_gate(candidate, ReleaseDir.read(Path(base.path)), suites=SUITES)

    assert result.passed and result.new_failures == []
    assert result.candidate_failures == ["tests::tests.test_a::test_known_broken"]
    candidate.refresh_from_db()
    assert candidate.state == Release.State.GATED


def test_a_non_zero_exit_without_readable_failures_rejects(repo: Repo, root: Path) -> None:
    base = release_with(repo, root, {"tests/test_a.py": PASSING})
    candidate = release_with(repo, root, {"tests/test_a.py": PASSING, "conftest.py": CRASH})

    result = gate.run_gate(candidate, ReleaseDir.read(Path(base.path)), suites=SUITES)

    assert not result.passed and result.new_failures == ["tests::<unparsable exit 3>"]
    run = next(r for r in result.runs if r["side"] == "candidate")
    assert run["exit_code"] == 3 and run["failures"] is None and "junit.xml" in run["problem"]
    candidate.refresh_from_db()
    assert candidate.state == Release.State.REJECTED


def test_the_suites_run_offline_with_a_read_only_root(repo: Repo, root: Path) -> None:
    candidate = release_with(repo, root, {"tests/test_sandbox.py": SANDBOX_PROBE})
    listening = subprocess.run(["python3", "-c", "import socket; socket.create_connection(('127.0.0.1', 5432), timeout=2)"])
    assert listening.returncode == 0  # reachable from here: only the sandbox cuts it off

    result = gate.run_gate(candidate, None, suites=SUITES)

    assert result.passed and result.candidate_failures == [], result.runs
    assert not (Path(candidate.path) / "code" / "written-by-a-test").exists()


def test_junit_parsing_and_the_unparsable_rule(tmp_path: Path) -> None:
    broken = tmp_path / "broken.xml"
    broken.write_text("<testsuites><testsuite><testcase name='x'>")
    with pytest.raises(ValueError):
        gate.parse_junit(broken, "s")
    with pytest.raises(ValueError):
        gate.parse_junit(tmp_path / "missing.xml", "s")
    good = tmp_path / "good.xml"
    good.write_text(
        "<testsuites><testsuite>"
        "<testcase classname='m' name='ok'/>"
        "<testcase classname='m' name='bad'><failure message='x'/></testcase>"
        "<testcase classname='m' name='err'><error message='y'/></testcase>"
        "<testcase classname='m' name='skipped'><skipped/></testcase>"
        "</testsuite></testsuites>"
    )
    assert gate.parse_junit(good, "s") == {"s::m::bad", "s::m::err"}
    # exit 0 with nothing failed passes; a non-zero exit naming no failure counts as one
    assert gate.evaluate([SuiteRun("s", 0, set())], []).passed
    assert not gate.evaluate([SuiteRun("s", 2, set())], [SuiteRun("s", 2, set())]).passed  # the base crashing too cancels nothing
    assert gate.evaluate([SuiteRun("s", 1, None)], []).new_failures == ["s::<unparsable exit 1>"]
    # an unreadable base only shrinks F_base: it never lets a candidate failure through
    assert gate.evaluate([SuiteRun("s", 1, {"s::m::bad"})], [SuiteRun("s", 1, None)]).new_failures == ["s::m::bad"]


def test_only_a_built_release_is_gated(repo: Repo, root: Path) -> None:
    candidate = release_with(repo, root, {"tests/test_a.py": PASSING})
    Release.objects.filter(id=candidate.id).update(state=Release.State.VOID)
    candidate.refresh_from_db()
    with pytest.raises(Exception) as refused:
        gate.run_gate(candidate, None, runner=lambda *_: pytest.fail("no suite may run"))
    assert getattr(refused.value, "code", None) == "release_state_changed"


def test_several_suites_are_one_failure_set(repo: Repo, root: Path) -> None:
    files = {"tests/test_a.py": PASSING, "other/test_b.py": KNOWN_FAILURE}
    base = release_with(repo, root, files)
    candidate = release_with(repo, root, {**files, "fix.txt": "x\n"})
    suites = (Suite("unit", ("tests",), QUICK), Suite("other", ("other",), QUICK))

    result = gate.run_gate(candidate, ReleaseDir.read(Path(base.path)), suites=suites)
    assert [r["suite"] for r in result.runs] == ["unit", "other", "unit", "other"]

    assert result.passed and result.candidate_failures == ["other::other.test_b::test_known_broken"]
