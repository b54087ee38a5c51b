"""The candidate gate: F_cand minus F_base must be empty; an unparsable non-zero exit is a
failure. Tiny generated pytest suites run for real in bubblewrap (offline, read-only root)
from real release directories with their own venv."""

from __future__ import annotations

import io
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from releases import builds, gate
from releases.gate import Suite, SuiteRun
from releases.models import Release, ReleaseEvent
from releases.pointers import ReleaseDir, set_pointer
from tests.support.release_support import Repo

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

from port import PORT


def test_no_network():
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", PORT), timeout=2)


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
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        candidate = release_with(repo, root, {"tests/test_sandbox.py": SANDBOX_PROBE, "tests/port.py": f"PORT = {port}\n"})
        listening = subprocess.run(["python3", "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"])
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


# A small Django site whose suite starts the way the project's does: pytest.ini names the
# test settings, pytest-django (autoloaded, as in the project) imports them, and the base
# settings create their default data directory, ./var beside the code, and a secret key
# in it at import (yimi_project/settings.py). In a release, code/ is read-only.
SITE_SETTINGS = """\
import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]
DATA_DIR = Path(os.environ.get("YIMI_DATA_DIR", BASE_DIR / "var")).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
_key = DATA_DIR / "secret_key"
if not _key.exists():
    _key.write_text(os.urandom(16).hex())
SECRET_KEY = _key.read_text()
SECRETS_DIR = Path(os.environ.get("YIMI_SECRETS_DIR", "/run/secrets"))
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(DATA_DIR / "site.sqlite3")}}
USE_TZ = True
"""
SITE_TEST_SETTINGS = """\
import tempfile
from pathlib import Path

from site_settings.settings import *  # noqa: F403

DATA_DIR = Path(tempfile.mkdtemp(prefix="site-test-data-"))
DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test.sqlite3")}
"""
SITE_TESTS = """\
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User


def test_a_row_is_stored(db):
    User.objects.create(username="owner")
    assert User.objects.get().username == "owner"


def test_the_data_directory_is_writable_and_outside_the_code():
    assert not settings.DATA_DIR.is_relative_to(Path.cwd())
    (settings.DATA_DIR / "written").write_text("x")
    assert list(settings.SECRETS_DIR.iterdir()) == []  # none of the live host's secrets
"""
SITE_KNOWN_FAILURE = "\n\ndef test_known_broken():\n    assert 'the fix' == 'not yet'\n"
SITE_DOES_NOT_START = SITE_SETTINGS + (
    "\nfrom django.core.exceptions import ImproperlyConfigured\n\n"
    "raise ImproperlyConfigured('SITE_MODEL_URL is not set: the site cannot start without a model')\n"
)
SITE_PYTEST_INI = "[pytest]\nDJANGO_SETTINGS_MODULE = site_settings.test_settings\ntestpaths = tests\n"
# The documented operator form: `release gate BUILD --suite tests=tests`.
DOCUMENTED_SUITE = ("--suite", "tests=tests")


def site_release(repo: Repo, root: Path, message: str, *, settings: str = SITE_SETTINGS, tests: str = SITE_TESTS) -> Release:
    commit = repo.commit(message, files={
        "pytest.ini": SITE_PYTEST_INI, "site_settings/__init__.py": "", "site_settings/settings.py": settings,
        "site_settings/test_settings.py": SITE_TEST_SETTINGS, "tests/test_site.py": tests,
    })  # fmt: skip
    return builds.build_directory_release(repo.path, commit, root=root, make_venv=builds.shared_venv)


def gate_command(release: Release) -> str:
    out = io.StringIO()
    try:
        call_command("release", "gate", release.build_id, *DOCUMENTED_SUITE, stdout=out)
    except CommandError as exc:
        raise AssertionError(f"{exc}\n{out.getvalue()}") from None
    return out.getvalue()


def test_a_clean_candidate_whose_settings_make_their_data_directory_passes(repo: Repo, root: Path) -> None:
    candidate = site_release(repo, root, "A site that stores its owner")

    out = gate_command(candidate)

    assert "no live release" in out and "passed: no new failures (0 known)" in out, out
    candidate.refresh_from_db()
    assert candidate.state == Release.State.GATED
    [run] = candidate.gate_result["runs"]
    assert run["exit_code"] == 0 and run["failures"] == [] and "2 passed" in run["output"], run
    assert not (Path(candidate.path) / "code" / "var").exists()


def test_the_base_is_the_live_release_and_its_failures_are_known(repo: Repo, root: Path) -> None:
    live = site_release(repo, root, "The live version", tests=SITE_TESTS + SITE_KNOWN_FAILURE)
    set_pointer(root, "current", Path(live.path))
    candidate = site_release(repo, root, "A fix elsewhere", tests=SITE_TESTS + SITE_KNOWN_FAILURE + "# the fix\n")
    assert candidate.base_commit == live.commit  # built on what runs now

    out = gate_command(candidate)

    assert f"against {live.build_id}" in out and "passed: no new failures (1 known)" in out, out
    candidate.refresh_from_db()
    assert [r["side"] for r in candidate.gate_result["runs"]] == ["candidate", "base"]
    assert candidate.gate_result["base_build"] == live.build_id
    assert candidate.gate_result["new_failures"] == [] and len(candidate.gate_result["base_failures"]) == 1


def test_a_suite_that_fails_shows_the_operator_its_last_lines(repo: Repo, root: Path) -> None:
    candidate = site_release(repo, root, "A site that needs a model", settings=SITE_DOES_NOT_START)

    out = io.StringIO()
    with pytest.raises(CommandError) as rejected:
        call_command("release", "gate", candidate.build_id, *DOCUMENTED_SUITE, stdout=out)

    assert "(gate_rejected)" in str(rejected.value)
    shown = out.getvalue()
    assert "new failure: tests::<unparsable exit" in shown
    assert "candidate suite tests exited" in shown and "junit.xml" in shown and "its last lines:" in shown
    assert any(
        line.startswith("  | ") and "SITE_MODEL_URL is not set: the site cannot start without a model" in line
        for line in shown.splitlines()
    ), shown
    candidate.refresh_from_db()
    assert candidate.state == Release.State.REJECTED
    assert "SITE_MODEL_URL is not set" in candidate.gate_result["runs"][0]["output"]


def test_a_failing_test_is_shown_with_pytest_s_summary(repo: Repo, root: Path) -> None:
    candidate = site_release(repo, root, "A site with a new bug", tests=SITE_TESTS + SITE_KNOWN_FAILURE)

    result = gate.run_gate(candidate, None, suites=(Suite("tests", ("tests",)),))

    assert not result.passed and result.new_failures == ["tests::tests.test_site::test_known_broken"]
    [run] = result.explained_runs()
    assert "FAILED tests/test_site.py::test_known_broken" in run["output"] and "1 failed, 2 passed" in run["output"]


def test_the_output_kept_is_the_last_lines_of_what_the_suite_printed(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_text("".join(f"line {n}\n" for n in range(1, 10001)))
    assert gate.tail(log, lines=3) == "line 9998\nline 9999\nline 10000"
    assert gate.tail(log, lines=1000, chars=12) == "9\nline 10000"
    log.write_text("")
    assert gate.tail(log) == ""


def test_the_settings_name_a_data_directory_they_cannot_create(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory\n")
    data_dir = tmp_path / "a-file" / "data"
    env = {"PATH": "/usr/bin:/bin", "YIMI_DATA_DIR": str(data_dir), "YIMI_SECRETS_DIR": str(tmp_path)}

    done = subprocess.run(
        [sys.executable, "-c", "import yimi_project.settings"], cwd=settings.BASE_DIR, env=env, capture_output=True, text=True
    )

    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        f"django.core.exceptions.ImproperlyConfigured: the data directory {data_dir} cannot be created (Not a directory): "
        "set YIMI_DATA_DIR to a writable directory"
    ), done.stderr
