"""The lock files `./yimi` installs from: every package pinned, each with its hashes, and
each direct requirement locked at the version requirements*.txt pins (README
"Dependencies"; refresh with ./yimi lock)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def direct_pins(path: Path) -> dict[str, str]:
    """name → version of a requirements*.txt, following -r includes."""
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            pins |= direct_pins(path.parent / line[3:].strip())
        elif line:
            match = PIN.match(line)
            assert match, f"{path.name}: not pinned with ==: {line}"
            pins[canonical(match[1])] = match[2]
    return pins


def locked(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name → (version, hashes) of a lock file."""
    entries: dict[str, tuple[str, list[str]]] = {}
    current: list[str] | None = None
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            match = PIN.match(line)
            assert match, f"{path.name}: not pinned with ==: {line}"
            current = []
            entries[canonical(match[1])] = (match[2], current)
        elif current is not None:
            current += re.findall(r"--hash=sha256:([0-9a-f]{64})", line)
    return entries


@pytest.mark.parametrize(
    "requirements, lock",
    [("requirements.txt", "requirements.lock"), ("requirements-dev.txt", "requirements-dev.lock"), ("requirements-voice.txt", "requirements-voice.lock")],
)
def test_every_direct_requirement_is_locked_at_its_pinned_version(requirements: str, lock: str) -> None:
    entries = locked(ROOT / lock)
    for name, version in direct_pins(ROOT / requirements).items():
        assert name in entries, f"{name} is in {requirements} but not in {lock}: run ./yimi lock"
        assert entries[name][0] == version, f"{name}: {requirements} pins {version}, {lock} has {entries[name][0]}: run ./yimi lock"


@pytest.mark.parametrize("lock", ["requirements.lock", "requirements-dev.lock", "requirements-nodeps.lock", "requirements-voice.lock"])
def test_every_locked_package_has_its_hashes(lock: str) -> None:
    entries = locked(ROOT / lock)
    assert entries
    assert not [name for name, (_, hashes) in entries.items() if not hashes]


def test_the_test_environment_runs_what_production_runs() -> None:
    runtime, dev = locked(ROOT / "requirements.lock"), locked(ROOT / "requirements-dev.lock")
    assert {n: v for n, (v, _) in runtime.items()} == {n: dev[n][0] for n in runtime if n in dev}
    assert runtime.keys() <= dev.keys()


def test_the_voice_extra_installs_on_top_of_the_others_without_changing_them() -> None:
    """requirements-voice.lock goes on top of requirements.lock (./yimi up --voice) or the dev
    lock (YIMI_VOICE=1 ./yimi test): every package they share is locked at the same version."""
    voice, dev = locked(ROOT / "requirements-voice.lock"), locked(ROOT / "requirements-dev.lock")
    assert {n: v for n, (v, _) in voice.items() if n in dev} == {n: dev[n][0] for n in voice if n in dev}
    assert locked(ROOT / "requirements.lock").keys() <= voice.keys()


def test_every_install_checks_hashes() -> None:
    """./yimi and the Docker image install only lock files, in hash-checking mode."""
    for script in (ROOT / "yimi", ROOT / "docker" / "Dockerfile"):
        text = script.read_text()
        project_installs = [line for line in text.splitlines() if re.search(r"\bpip\"? install\b.* -r ", line)]
        assert project_installs, script
        for line in project_installs:
            assert "--require-hashes" in line and re.search(r' -r ("\$lock"|\S+\.lock)(\s|$)', line), f"{script.name}: {line.strip()}"
    calls = re.findall(r"^\s*install (\S+)", (ROOT / "yimi").read_text(), re.MULTILINE)
    assert calls and all(lock.endswith(".lock") and (ROOT / lock).is_file() for lock in calls), calls
