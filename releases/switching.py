"""Putting a gated candidate live on this host (flows F5 and F6).

``switch_release``: 0. only a gated candidate (one the owner refused: ``baseline_refused``);
1. **re-check**: the candidate's base must be the commit ``current``
runs at this moment, or the candidate is ``void`` (rebuild it on the live version); 1b.
**protected baseline**: the check runs again (``releases.baseline.check_release``: a
card is opened if the build and the gate did not), and a candidate with a card goes on
only once the owner approved it (``require_clear``: ``baseline_waiting`` while it is open,
``baseline_refused`` after a refusal); 2.
**wait for idle** (``releases.idle``); 3. **switch** (``releases.pointers.switch``:
backup, stop, ``previous ← current``, ``current ← candidate``, start, verify; back to the
previous release on failure), with ``expected_current`` = the build the re-check saw, so
a release that took over meanwhile makes this one fail (``current_changed``) instead of
being replaced; 4. the row: ``switched`` or ``failed``; 5. the owner gets a system
message with the fix's first line (≤200 characters); 6. memory the previous version added
while it ran after a rollback is imported (``releases.memory_bridge``).

``rollback_release``: the plain immediate rollback of the operator command
(``pointers.rollback_to_previous``), recorded on both rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from accounts.services import get_owner
from memory.timeline.entries import append_entry
from releases import backup as release_backup
from releases import baseline, idle, memory_bridge, pointers
from releases import services as release_services
from releases.models import Release
from releases.pointers import ReleaseDir, Service, SwitchResult
from yimi_project import push
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

NOTICE_CODE = "release"


def recheck_base(release: Release, *, root: Path | None = None) -> str | None:
    """The build ``current`` runs, if ``release`` was made on its commit; otherwise the
    release becomes ``void`` (compare-and-set from built/gated) and ``release_void`` is
    raised with the reason."""
    live = pointers.read_pointers(root).current
    live_commit = live.commit if live else ""
    if release.base_commit != live_commit:
        reason = (
            f"built on {release.base_commit[:12] or 'no release'}, but the live commit is now {live_commit[:12] or 'none'}: "
            "rebuild it on the live version"
        )
        release_services.advance(release, Release.State.VOID, expected=(Release.State.BUILT, Release.State.GATED), reason=reason)
        release_services.record_event("void", release=release, to_build=release.build_id, reason=reason)
        raise YimiError("release_void", reason)
    release_services.record_event("recheck", release=release, to_build=release.build_id, reason=f"base {live_commit[:12] or '(none)'} is live")
    return live.build_id if live else None


def release_notice_text(fix: str) -> str:
    return f"Yimi was updated: {fix}" if fix else "Yimi was updated to a new version."


def notify_owner(release: Release) -> int | None:
    """The owner's system message after a switch: a ``notice`` timeline entry carrying the
    fix's first line, pushed to the owner's devices once committed. Returns its seq (None
    without an owner)."""
    owner = get_owner()
    if owner is None:
        return None
    with transaction.atomic():
        entry = append_entry(owner_id=owner.id, kind="notice", text=release_notice_text(release.fix_line), notice_code=NOTICE_CODE)
        transaction.on_commit(partial(_announce, owner.id, entry.seq, entry.text))
    release_services.record_event("notify", release=release, to_build=release.build_id, details={"seq": entry.seq})
    return entry.seq


def _tell_owner(release: Release) -> None:
    notify_owner(release)


def _announce(owner_id: int, seq: int, text: str) -> None:
    try:
        push.announce_sync(owner_id, seq=seq, code=NOTICE_CODE, text=text)
    except Exception as exc:  # noqa: BLE001 - the entry is committed; devices catch up with sync
        log_event("release_announce_failed", logging.WARNING, seq=seq, error=type(exc).__name__)


def switch_release(
    release: Release,
    *,
    services: Sequence[Service],
    root: Path | None = None,
    idle_timeout: float = 0.0,
    idle_check: Callable[[], list[idle.Blocker]] | None = None,
    backup: Callable[[], Path | None] = release_backup.backup_now,
    verify: pointers.Verify | None = None,
    sleep: Callable[[float], None] | None = None,
    progress: Callable[[str], None] = lambda _line: None,
) -> SwitchResult:
    """Re-check, wait for idle, switch, record, tell the owner (steps in the module docstring)."""
    root = root or pointers.releases_root()
    if release.state != Release.State.GATED:
        if release.state == Release.State.REFUSED:
            baseline.require_clear(release)  # baseline_refused, with the areas the owner said no to
        raise YimiError("release_not_gated", f"release {release.build_id} is {release.state}; only a gated release is switched in")
    progress("re-checking the base against the live commit")
    live_build = recheck_base(release, root=root)
    verdict = baseline.check_release(release, "switch", root=root)
    progress(baseline.describe(release) if verdict.kind != "clear" else "protected baseline: not touched")
    baseline.require_clear(release)  # a candidate touching the protected baseline goes on only once approved
    progress("waiting for idle")
    idle.wait_for_idle(
        timeout=idle_timeout, progress=progress, check=idle_check or partial(idle.blockers, root=root), sleep=sleep or time.sleep
    )
    progress(f"switching {live_build or '(none)'} -> {release.build_id}")
    result = pointers.switch(
        ReleaseDir.read(Path(release.path)),
        services=services,
        backup=backup,
        verify=verify,
        root=root,
        expected_current=live_build,
        notify=lambda _result: _tell_owner(release),
    )
    if result.ok:
        release_services.advance(release, Release.State.SWITCHED, expected=(Release.State.GATED,), reason="switched in", switched_at=timezone.now())
        idle.acknowledge_oom(root, idle.setting_paths("YIMI_RELEASE_OOM_FILES"))  # the services started afresh
        _import_memory_added_meanwhile(result, progress)
    elif result.state != "backup_failed":
        release_services.advance(release, Release.State.FAILED, expected=(Release.State.GATED,), reason=result.summary()[:2000])
    return result


def _import_memory_added_meanwhile(result: SwitchResult, progress: Callable[[str], None]) -> None:
    """Upgrading again after a rollback: the core memory entries the old version added
    while it ran (``releases.memory_bridge``; nothing when it never ran after a rollback)."""
    owner = get_owner()
    previous = pointers.read_pointers(None if result.release is None else result.release.path.parent).previous
    if owner is None or previous is None:
        return
    try:
        reports = memory_bridge.import_added_meanwhile(previous.path, owner.id)
    except Exception as exc:  # noqa: BLE001 - the switch stands; the operator sees what did not come over
        progress(f"memory added under the previous version was not imported: {type(exc).__name__}: {exc}")
        log_event("release_memory_import_failed", logging.WARNING, error=type(exc).__name__)
        return
    if reports:
        progress("imported memory the previous version added: " + ", ".join(sorted(reports)))


def rollback_release(
    reason: str,
    *,
    services: Sequence[Service],
    root: Path | None = None,
    verify: pointers.Verify | None = None,
) -> SwitchResult:
    """Go back to ``previous`` now (the operator's plain rollback): the release rolled
    back from becomes ``rolled_back``; not to a version whose protected-baseline card the
    owner refused or has not answered (``releases.baseline.require_rollback_target``). Only code and configuration change: the database is
    not restored, nothing done outside is undone."""
    if not reason.strip():
        raise YimiError("invalid_request", "a rollback needs a reason")
    before = pointers.read_pointers(root)
    baseline.require_rollback_target(before.previous_build)  # never back to a version the owner refused
    result = pointers.rollback_to_previous(
        reason, services=services, verify=verify, root=root, expected_current=before.current_build,
        before_switch=memory_bridge.before_rollback,  # the core memory projected for the old version first
    )
    if result.ok and result.from_build:
        release_services.mark_rolled_back(result.from_build, reason)
    return result
