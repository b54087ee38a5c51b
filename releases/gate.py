"""The candidate gate: ``F_cand \\ F_base = ∅``.

The candidate's test suites and the live base's run the same way: offline, with a
read-only root, in bubblewrap (``bwrap --ro-bind / / --unshare-net``, ``/tmp`` read-only
like the rest, one writable output directory for the JUnit XML that is also ``TMPDIR`` and
``HOME``), with the release's own interpreter. Each suite writes JUnit
XML; its failure set is every test case with a ``failure`` or ``error`` (by
``classname::name``, prefixed with the suite's name).

The rule: the candidate's failures minus the base's must be empty. A suite that exits
non-zero but whose failures cannot be read (no XML, broken XML, or XML naming no failure)
is a failure of its own (``<suite>::<unparsable exit N>``) that no base failure cancels;
a base suite whose failures cannot be read adds nothing to ``F_base``, so it can never
let a candidate through.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from releases import services
from releases.models import Release
from releases.pointers import ReleaseDir
from yimi_project.errors import YimiError

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Suite:
    """One test suite: a name, the pytest arguments (paths, ``-m``…) run in ``code/``, and
    environment variables it needs (the sandbox starts from an empty environment)."""

    name: str
    args: tuple[str, ...] = ("tests",)
    env: tuple[tuple[str, str], ...] = ()


DEFAULT_SUITES = (Suite("tests"),)


@dataclass
class SuiteRun:
    suite: str
    exit_code: int
    failures: set[str] | None  # None: the failures could not be read
    problem: str = ""

    def unparsable(self) -> str | None:
        """The failure a non-zero exit naming no failure stands for (unreadable XML, or a
        crash/collection error without test cases); None otherwise."""
        if self.exit_code != 0 and not self.failures:
            return f"{self.suite}::<unparsable exit {self.exit_code}>"
        return None


@dataclass
class GateResult:
    passed: bool
    new_failures: list[str]
    candidate_failures: list[str]
    base_failures: list[str]
    runs: list[dict[str, Any]] = field(default_factory=list)

    def reason(self) -> str:
        if self.passed:
            return f"no new failures ({len(self.candidate_failures)} known)"
        return f"{len(self.new_failures)} new failure(s): " + ", ".join(self.new_failures[:10])


def parse_junit(path: Path, suite: str) -> set[str]:
    """The failed and errored test cases of a JUnit XML file; raises ``ValueError`` when
    the file is missing or is not JUnit XML."""
    try:
        tree = ElementTree.parse(path)
    except (OSError, ElementTree.ParseError) as exc:
        raise ValueError(f"cannot read {path.name}: {exc}") from exc
    top = tree.getroot()
    if top.tag not in ("testsuites", "testsuite"):
        raise ValueError(f"{path.name} is not JUnit XML (root {top.tag!r})")
    failed = set()
    for case in top.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.add(f"{suite}::{case.get('classname', '')}::{case.get('name', '')}")
    return failed


def sandbox_argv(release: Path, out: Path, command: Sequence[str], env: Sequence[tuple[str, str]] = ()) -> list[str]:
    """``command`` offline with a read-only root: every mount read-only (``/tmp`` too: a
    release or the venv a shared release reads may live there, so it is not hidden behind
    a private tmpfs), only ``out`` writable and given as ``TMPDIR`` and ``HOME``, and none
    of this process's environment (no database URL, no settings module, no secrets: the
    suite sets up what it needs itself)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise YimiError("sandbox_unavailable", "bubblewrap (bwrap) is not installed: the gate does not run tests unsandboxed")
    return [
        bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--bind", str(out), str(out),
        "--unshare-net", "--unshare-ipc", "--unshare-pid", "--die-with-parent", "--clearenv",
        "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8",
        "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--setenv", "HOME", str(out), "--setenv", "TMPDIR", str(out),
        *[arg for name, value in env for arg in ("--setenv", name, value)],
        "--chdir", str(release / "code"), *command,
    ]  # fmt: skip


def run_suite(release: ReleaseDir, suite: Suite, *, timeout: float = 3600.0) -> SuiteRun:
    """Run one suite of ``release`` in the sandbox and read its failures."""
    python = release.path / "venv" / "bin" / "python"
    with tempfile.TemporaryDirectory(prefix="yimi-gate-") as tmp:
        out = Path(tmp)
        junit = out / "junit.xml"
        command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *suite.args]
        try:
            done = subprocess.run(sandbox_argv(release.path, out, command, suite.env), capture_output=True, timeout=timeout)
            exit_code = done.returncode
        except subprocess.TimeoutExpired:
            return SuiteRun(suite.name, -1, None, f"timed out after {timeout:.0f} s")
        try:
            return SuiteRun(suite.name, exit_code, parse_junit(junit, suite.name))
        except ValueError as exc:
            return SuiteRun(suite.name, exit_code, None, str(exc))


def evaluate(candidate: Sequence[SuiteRun], base: Sequence[SuiteRun]) -> GateResult:
    """``F_cand \\ F_base = ∅``. A candidate suite's unparsable non-zero exit is a new
    failure whatever the base did (nothing is known about the candidate then); the base's
    counts for nothing in ``F_base``."""
    crashed = {m for m in (r.unparsable() for r in candidate) if m}
    f_cand = set().union(*(r.failures or set() for r in candidate)) | crashed
    f_base = set().union(*(r.failures or set() for r in base))
    new = sorted((f_cand - f_base) | crashed)
    runs = [{"side": "candidate", **asdict(r)} for r in candidate] + [{"side": "base", **asdict(r)} for r in base]
    for r in runs:
        r["failures"] = sorted(r["failures"]) if r["failures"] is not None else None
    return GateResult(passed=not new, new_failures=new, candidate_failures=sorted(f_cand), base_failures=sorted(f_base), runs=runs)


def run_gate(
    release: Release,
    base: ReleaseDir | None,
    *,
    suites: Sequence[Suite] = DEFAULT_SUITES,
    progress: Progress = lambda _line: None,
    runner: Callable[[ReleaseDir, Suite], SuiteRun] = run_suite,
) -> GateResult:
    """Gate ``release`` against the live ``base`` (None on a first install: ``F_base = ∅``).

    Steps: 1. the release must be ``built`` (a gated, rejected or void one is not gated
    again); 2. each suite runs for the candidate, then for the base; 3. ``evaluate``;
    4. the row moves to ``gated`` or ``rejected`` by compare-and-set from ``built``, with
    the result, and a ``gate`` event is recorded.
    """
    if release.state != Release.State.BUILT:
        raise YimiError("release_state_changed", f"release {release.build_id} is {release.state}; only a built release is gated")
    candidate_dir = ReleaseDir.read(Path(release.path))
    cand_runs, base_runs = [], []
    for suite in suites:
        progress(f"candidate: running suite {suite.name}")
        cand_runs.append(runner(candidate_dir, suite))
        progress(f"candidate: suite {suite.name} exit {cand_runs[-1].exit_code}")
        if base is not None:
            progress(f"base {base.commit[:12]}: running suite {suite.name}")
            base_runs.append(runner(base, suite))
            progress(f"base: suite {suite.name} exit {base_runs[-1].exit_code}")
    result = evaluate(cand_runs, base_runs)
    stored = {**asdict(result), "base_build": base.build_id if base else None}
    state = Release.State.GATED if result.passed else Release.State.REJECTED
    services.advance(release, state, expected=(Release.State.BUILT,), reason=result.reason(), gate_result=stored)
    services.record_event("gate", release=release, to_build=release.build_id, reason=result.reason(), details={"passed": result.passed, "new_failures": result.new_failures})
    return result
