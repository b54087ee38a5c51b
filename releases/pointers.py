"""Which release runs: the ``current`` and ``previous`` pointers, and moving them.

Under the releases root (``YIMI_RELEASES_ROOT``, default ``<data dir>/releases``) every
release is a directory holding ``release.json`` (build id, commit, kind, base commit); a
directory release also holds ``code/`` and ``venv/`` (``releases.builds``). ``current`` and
``previous`` are symlinks to two of them, by relative name. Each is replaced atomically: a
new symlink under a temporary name, then ``os.replace`` onto the pointer, then an fsync of
the directory, so a reader (the web process, the watchdog, ``release status``) sees the
old pointer or the new one, never none. A crash between the two moves of a switch leaves
``previous == current`` (the old release): still the old one running, nothing lost.

Every pointer move holds ``pointer_lock(root)`` (``fcntl.flock`` on ``<root>/.lock``): a
switch, a watchdog rollback and a requested rollback never interleave, and each checks
``expected_current`` under the lock (compare-and-set on the pointer: the one that lost the
race sees ``current_changed`` and moves nothing).

Services are whatever runs a release (``Service``: start on a release directory, stop,
health, the build id it reports). ``switch`` and ``rollback_to_previous`` only move
pointers and restart services; they record each move in ``<root>/history.jsonl`` (the
record that needs no database) and through ``journal`` (by default a ``ReleaseEvent``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from django.conf import settings

from releases import services as release_services
from yimi_project.errors import YimiError
from yimi_project.files import fsync_dir, write_atomically
from yimi_project.logs import log_event

CURRENT = "current"
PREVIOUS = "previous"
RELEASE_FILE = "release.json"
HISTORY_FILE = "history.jsonl"
LOCK_FILE = ".lock"

Journal = Callable[[str, dict[str, Any]], None]


def releases_root() -> Path:
    """The releases root of this host (``YIMI_RELEASES_ROOT``, default ``<data dir>/releases``)."""
    configured = getattr(settings, "YIMI_RELEASES_ROOT", None)
    return Path(configured) if configured else Path(settings.DATA_DIR) / "releases"


@dataclass(frozen=True)
class ReleaseDir:
    """One release directory as its ``release.json`` describes it."""

    path: Path
    build_id: str
    commit: str
    kind: str = "directory"
    base_commit: str = ""
    message: str = ""

    @classmethod
    def read(cls, path: Path) -> ReleaseDir:
        try:
            meta = json.loads((path / RELEASE_FILE).read_text())
            return cls(
                path=path.resolve(), build_id=str(meta["build_id"]), commit=str(meta["commit"]),
                kind=str(meta.get("kind", "directory")), base_commit=str(meta.get("base_commit", "")),
                message=str(meta.get("message", "")),
            )
        except (OSError, ValueError, KeyError, TypeError):
            raise YimiError("release_invalid", f"{path.name} is not a release directory (no readable {RELEASE_FILE})") from None

    def write(self) -> None:
        """Write ``release.json`` (once, when the release is built)."""
        body = {
            "build_id": self.build_id, "commit": self.commit, "kind": self.kind,
            "base_commit": self.base_commit, "message": self.message,
        }
        write_atomically(self.path / RELEASE_FILE, json.dumps(body, indent=1, ensure_ascii=False).encode())


@dataclass(frozen=True)
class Pointers:
    current: ReleaseDir | None
    previous: ReleaseDir | None

    @property
    def current_build(self) -> str | None:
        return self.current.build_id if self.current else None

    @property
    def previous_build(self) -> str | None:
        return self.previous.build_id if self.previous else None


def _target(root: Path, name: str) -> ReleaseDir | None:
    link = root / name
    if not link.is_symlink():
        return None
    target = root / os.readlink(link)
    if not target.is_dir():
        raise YimiError("release_invalid", f"the {name} pointer names {os.readlink(link)!r}, which is not there")
    return ReleaseDir.read(target)


def read_pointers(root: Path | None = None) -> Pointers:
    """``current`` and ``previous`` under ``root`` (None where a pointer is not set)."""
    root = root or releases_root()
    return Pointers(current=_target(root, CURRENT), previous=_target(root, PREVIOUS))


def set_pointer(root: Path, name: str, target: ReleaseDir | Path | None) -> None:
    """Point ``root/name`` at ``target`` (a directory directly under ``root``), atomically;
    None removes the pointer."""
    if name not in (CURRENT, PREVIOUS):
        raise ValueError(f"unknown pointer {name!r}")
    link = root / name
    if target is None:
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        fsync_dir(root)
        return
    path = target.path if isinstance(target, ReleaseDir) else Path(target)
    if path.resolve().parent != root.resolve():
        raise YimiError("release_invalid", f"{path} is not a release directory under {root}")
    tmp = root / f".{name}.{uuid.uuid4().hex}"
    os.symlink(path.name, tmp)
    os.replace(tmp, link)
    fsync_dir(root)


@contextlib.contextmanager
def pointer_lock(root: Path | None = None) -> Iterator[None]:
    """Hold the releases root's pointer lock (blocking) for the body."""
    root = root or releases_root()
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def append_history(root: Path, kind: str, fields: dict[str, Any]) -> None:
    """One JSON line in ``<root>/history.jsonl`` (fsynced): the record of pointer moves that
    a process without the database (the watchdog) can read too."""
    line = json.dumps({"at": datetime.now(UTC).isoformat(), "kind": kind, **fields}, default=str, ensure_ascii=False)
    with open(root / HISTORY_FILE, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_history(root: Path | None = None) -> list[dict[str, Any]]:
    path = (root or releases_root()) / HISTORY_FILE
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    return rows


# --- services --------------------------------------------------------------------------------


@runtime_checkable
class Service(Protocol):
    """Something that runs a release: the web processes, the worker, a container.

    ``start(release)`` starts it from that release directory and returns once it was
    launched (not necessarily healthy); ``health()`` answers whether it is healthy now;
    ``build_id()`` is the build id the running service reports (None: not running or not
    answering)."""

    name: str

    def start(self, release: Path) -> None: ...

    def stop(self) -> None: ...

    def health(self) -> bool: ...

    def build_id(self) -> str | None: ...


Verify = Callable[[Sequence[Service], str], list[str]]


def verify_services(
    services: Sequence[Service],
    build_id: str,
    *,
    attempts: int = 30,
    interval: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """What is wrong with the running services, or ``[]``: each must be healthy and report
    ``build_id``. An unhealthy service gets up to ``attempts`` looks ``interval`` apart (it
    may still be starting); a healthy one reporting another build fails at once."""
    problems: list[str] = []
    for attempt in range(max(1, attempts)):
        problems = []
        wrong_build = False
        for service in services:
            try:
                healthy = service.health()
                running = service.build_id() if healthy else None
            except Exception as exc:  # noqa: BLE001 - a service that cannot answer is unhealthy
                healthy, running = False, None
                problems.append(f"{service.name}: health check failed ({type(exc).__name__})")
                continue
            if not healthy:
                problems.append(f"{service.name}: not healthy")
            elif running != build_id:
                wrong_build = True
                problems.append(f"{service.name}: runs {running or 'an unknown build'}, not {build_id}")
        if not problems or wrong_build:
            return problems
        if attempt + 1 < attempts:
            sleep(interval)
    return problems


def _stop_all(services: Sequence[Service]) -> list[str]:
    problems = []
    for service in reversed(services):
        try:
            service.stop()
        except Exception as exc:  # noqa: BLE001 - every service gets its stop; the failure is reported
            problems.append(f"{service.name}: stop failed ({type(exc).__name__}: {exc})")
    return problems


def _start_all(services: Sequence[Service], release: ReleaseDir) -> list[str]:
    problems = []
    for service in services:
        try:
            service.start(release.path)
        except Exception as exc:  # noqa: BLE001 - a service that does not start fails the verify
            problems.append(f"{service.name}: start failed ({type(exc).__name__}: {exc})")
    return problems


# --- switch and rollback ---------------------------------------------------------------------


@dataclass
class SwitchResult:
    """What a switch or rollback did.

    ``state``: ``switched`` | ``restored`` (the candidate did not verify; the previous
    release runs again) | ``restore_failed`` (neither verified) | ``backup_failed``
    (nothing moved) | ``rolled_back`` | ``rollback_failed`` (tried once; not retried).
    """

    ok: bool
    state: str
    to_build: str
    from_build: str | None
    problems: list[str] = field(default_factory=list)
    restore_problems: list[str] = field(default_factory=list)
    backup: Path | None = None
    reason: str = ""
    release: ReleaseDir | None = None

    def summary(self) -> str:
        text = f"{self.state}: {self.from_build or '(none)'} -> {self.to_build}"
        if self.problems:
            text += "; problems: " + "; ".join(self.problems)
        if self.restore_problems:
            text += "; restore problems: " + "; ".join(self.restore_problems)
        return text


class _Any:
    pass


ANY: Any = _Any()


def _check_expected(pointers: Pointers, expected_current: Any) -> None:
    if expected_current is ANY:
        return
    if pointers.current_build != expected_current:
        raise YimiError(
            "current_changed",
            f"the current release is {pointers.current_build or 'none'}, not {expected_current or 'none'}: someone else switched first",
        )


def _record(root: Path, journal: Journal | None, kind: str, fields: dict[str, Any]) -> None:
    append_history(root, kind, fields)
    if journal is None:
        return
    try:
        journal(kind, dict(fields))
    except Exception as exc:  # noqa: BLE001 - the move happened; history.jsonl has it
        log_event("release_journal_failed", logging.WARNING, kind=kind, error=type(exc).__name__)


def switch(
    candidate: ReleaseDir | Path,
    *,
    services: Sequence[Service],
    backup: Callable[[], Path | None],
    verify: Verify | None = None,
    notify: Callable[[SwitchResult], None] | None = None,
    root: Path | None = None,
    expected_current: Any = ANY,
    journal: Journal | None = release_services.journal,
) -> SwitchResult:
    """Make ``candidate`` the running release.

    Steps, under the pointer lock: 1. read the pointers; ``expected_current`` given and not
    what ``current`` is: ``current_changed``, nothing done; the candidate already current:
    ``already_current``; 2. ``backup()`` (database, model settings with their master key;
    ``releases.backup``): raising stops here (``backup_failed``, nothing stopped or moved);
    3. stop the services (writes stop); 4. ``previous ← current``, ``current ← candidate``;
    5. start the services on the candidate; 6. ``verify`` that every service runs the
    candidate's build and is healthy; 7a. verified: ``switched``, the journal records it and
    ``notify(result)`` runs (its failure is logged, the switch stands); 7b. not verified:
    stop, put both pointers back as they were, start the previous release and verify it
    (``restored``, or ``restore_failed`` with both lists of problems).
    """
    root = (root or releases_root()).resolve()
    release = candidate if isinstance(candidate, ReleaseDir) else ReleaseDir.read(Path(candidate))
    if release.path.resolve().parent != root:
        raise YimiError("release_invalid", f"{release.path} is not a release directory under {root}")
    check = verify or verify_services
    with pointer_lock(root):
        before = read_pointers(root)
        _check_expected(before, expected_current)
        if before.current_build == release.build_id:
            raise YimiError("already_current", f"{release.build_id} is already the current release")
        result = SwitchResult(ok=False, state="backup_failed", to_build=release.build_id, from_build=before.current_build, release=release)
        try:
            result.backup = backup()
        except Exception as exc:  # noqa: BLE001 - no backup, no switch
            result.problems = [f"backup failed: {type(exc).__name__}: {exc}"]
            _record(root, journal, "switch_failed", {"from_build": result.from_build, "to_build": result.to_build, "reason": result.problems[0]})
            return result
        problems = _stop_all(services)
        if before.current is not None:
            set_pointer(root, PREVIOUS, before.current)
        set_pointer(root, CURRENT, release)
        problems += _start_all(services, release)
        problems += check(services, release.build_id)
        if not problems:
            result.ok, result.state = True, "switched"
            _record(root, journal, "switch", {"from_build": result.from_build, "to_build": result.to_build, "backup": str(result.backup or "")})
            if notify is not None:
                try:
                    notify(result)
                except Exception as exc:  # noqa: BLE001 - the owner is told best-effort; the switch stands
                    log_event("release_notify_failed", logging.WARNING, error=type(exc).__name__)
            return result
        result.problems = problems
        restore = _stop_all(services)
        set_pointer(root, CURRENT, before.current)
        set_pointer(root, PREVIOUS, before.previous)
        if before.current is not None:
            restore += _start_all(services, before.current)
            restore += check(services, before.current.build_id)
        result.restore_problems = restore
        result.state = "restored" if not restore else "restore_failed"
        _record(root, journal, "switch_failed", {
            "from_build": result.from_build, "to_build": result.to_build, "reason": "; ".join(problems),
            "restored": not restore, "restore_problems": restore,
        })
        return result


def rollback_to_previous(
    reason: str,
    *,
    services: Sequence[Service],
    verify: Verify | None = None,
    root: Path | None = None,
    expected_current: Any = ANY,
    before_switch: Callable[[Pointers], None] | None = None,
    journal: Journal | None = release_services.journal,
    kind: str = "rollback",
) -> SwitchResult:
    """Run the previous release again: ``current ← previous``, ``previous ← current``.

    Steps, under the pointer lock: 1. read the pointers; no ``previous``:
    ``no_previous_release``; ``expected_current`` given and not what ``current`` is (a
    newer release took over, or someone rolled back already): ``current_changed``, nothing
    done; 2. ``before_switch(pointers)`` (e.g. project the core memory for the old
    version; raising stops here, nothing moved); 3. stop the services; 4. swap the two
    pointers; 5. start the services on the previous release and verify it; 6. recorded as
    ``kind`` (``rollback``) or ``rollback_failed`` — tried once: a rollback that does not
    verify is reported, never retried or undone here. It replaces code and configuration
    only: the database is not restored and outside actions are not undone.
    """
    root = (root or releases_root()).resolve()
    check = verify or verify_services
    with pointer_lock(root):
        before = read_pointers(root)
        if before.previous is None:
            raise YimiError("no_previous_release", "there is no previous release to go back to")
        _check_expected(before, expected_current)
        if before_switch is not None:
            before_switch(before)
        target = before.previous
        problems = _stop_all(services)
        set_pointer(root, CURRENT, target)
        set_pointer(root, PREVIOUS, before.current)
        problems += _start_all(services, target)
        problems += check(services, target.build_id)
        ok = not problems
        result = SwitchResult(
            ok=ok, state="rolled_back" if ok else "rollback_failed", to_build=target.build_id,
            from_build=before.current_build, problems=problems, reason=reason, release=target,
        )
        _record(root, journal, kind if ok else "rollback_failed", {
            "from_build": result.from_build, "to_build": result.to_build, "reason": reason, "problems": problems,
        })
        return result
