"""The candidate gate: ``F_cand \\ F_base = ∅``.

The candidate's test suites and the live base's run the same way: offline, with a
read-only root, in bubblewrap (``bwrap --ro-bind / / --unshare-net``, ``/tmp`` read-only
like the rest, one writable output directory for the JUnit XML that is also ``TMPDIR`` and
``HOME``), with the release's own interpreter. The suite gets a data directory and a
secrets directory of its own inside the output directory (``YIMI_DATA_DIR``, empty
``YIMI_SECRETS_DIR``): the settings create their default data directory inside ``code/``,
which is read-only, and must not read the live host's data or secrets either. Each suite
writes JUnit XML; its failure set is every test case with a ``failure`` or ``error`` (by
``classname::name``, prefixed with the suite's name). What the suite printed (stdout and
stderr as they came) is kept: its last lines go with the run, so an operator sees why a
suite failed, not only its exit code.

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

from releases import baseline, services
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
OUTPUT_LINES = 40
OUTPUT_CHARS = 8000


@dataclass
class SuiteRun:
    suite: str
    exit_code: int
    failures: set[str] | None  # None: the failures could not be read
    problem: str = ""
    output: str = ""  # the last lines the suite printed (``OUTPUT_LINES``, at most ``OUTPUT_CHARS``)

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

    def explained_runs(self) -> list[dict[str, Any]]:
        """The runs an operator needs to see the output of: every run whose failures could
        not be read (either side), and, when the gate rejects, every candidate run that
        exited non-zero."""
        return [
            r for r in self.runs
            if r["failures"] is None or (not self.passed and r["side"] == "candidate" and r["exit_code"] != 0)
        ]  # fmt: skip


def tail(path: Path, lines: int = OUTPUT_LINES, chars: int = OUTPUT_CHARS) -> str:
    """The last ``lines`` lines of the file ``path``, and at most its last ``chars``
    characters (only the file's end is read)."""
    with path.open("rb") as f:
        f.seek(max(0, f.seek(0, 2) - 4 * chars))
        text = f.read().decode(errors="replace")
    return "\n".join(text.rstrip().splitlines()[-lines:])[-chars:]


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
    a private tmpfs), only ``out`` writable and given as ``TMPDIR`` and ``HOME``, with
    ``out/data`` as ``YIMI_DATA_DIR`` and the empty ``out/secrets`` as ``YIMI_SECRETS_DIR``
    (``prepare_output`` makes both), and none of this process's environment (no database
    URL, no settings module, no secrets: the suite sets up what it needs itself). ``env``
    comes last, so a suite may set any of these otherwise."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise YimiError("sandbox_unavailable", "bubblewrap (bwrap) is not installed: the gate does not run tests unsandboxed")
    return [
        bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--bind", str(out), str(out),
        "--unshare-net", "--unshare-ipc", "--unshare-pid", "--die-with-parent", "--clearenv",
        "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8",
        "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--setenv", "HOME", str(out), "--setenv", "TMPDIR", str(out),
        "--setenv", "YIMI_DATA_DIR", str(out / "data"), "--setenv", "YIMI_SECRETS_DIR", str(out / "secrets"),
        *[arg for name, value in env for arg in ("--setenv", name, value)],
        "--chdir", str(release / "code"), *command,
    ]  # fmt: skip


def prepare_output(out: Path) -> None:
    """The suite's writable directory: ``data`` (its ``YIMI_DATA_DIR``) and an empty
    ``secrets`` (its ``YIMI_SECRETS_DIR``), both 0700."""
    for name in ("data", "secrets"):
        (out / name).mkdir(mode=0o700)


def run_suite(release: ReleaseDir, suite: Suite, *, timeout: float = 3600.0) -> SuiteRun:
    """Run one suite of ``release`` in the sandbox and read its failures, with the last
    lines it printed. The output goes to a file outside the sandbox's writable directory,
    so a long run holds no memory and a timed-out one still shows where it was."""
    python = release.path / "venv" / "bin" / "python"
    with tempfile.TemporaryDirectory(prefix="yimi-gate-") as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        prepare_output(out)
        log = Path(tmp) / "output.log"
        junit = out / "junit.xml"
        command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *suite.args]
        exit_code: int | None = None  # None: timed out
        with log.open("wb") as sink:
            try:
                exit_code = subprocess.run(
                    sandbox_argv(release.path, out, command, suite.env), stdin=subprocess.DEVNULL, stdout=sink,
                    stderr=subprocess.STDOUT, timeout=timeout,
                ).returncode
            except subprocess.TimeoutExpired:
                pass
        output = tail(log)
        if exit_code is None:
            return SuiteRun(suite.name, -1, None, f"timed out after {timeout:.0f} s", output)
        try:
            return SuiteRun(suite.name, exit_code, parse_junit(junit, suite.name), output=output)
        except ValueError as exc:
            return SuiteRun(suite.name, exit_code, None, str(exc), output)


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
    again; a refused one: ``baseline_refused``); 1b. the protected-baseline check
    (``releases.baseline.check_release``: the card is opened here if the build did not; the
    suites still run while it waits, the switch is what waits for the answer); 2. each
    suite runs for the candidate, then for the base; 3. ``evaluate``; 4. the row moves to
    ``gated`` or ``rejected`` by compare-and-set from ``built``, with the result, and a
    ``gate`` event is recorded.
    """
    if release.state != Release.State.BUILT:
        if release.state == Release.State.REFUSED:
            baseline.require_clear(release)  # baseline_refused, with the areas the owner said no to
        raise YimiError("release_state_changed", f"release {release.build_id} is {release.state}; only a built release is gated")
    candidate_dir = ReleaseDir.read(Path(release.path))
    baseline.check_release(release, "gate", root=candidate_dir.path.parent)  # asks the owner once, if the build did not
    progress(baseline.describe(release))
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
