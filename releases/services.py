"""The only code that writes the releases tables (``Release``, ``ReleaseEvent``).

Which release runs is the ``current`` / ``previous`` symlinks (``releases.pointers``); the
rows here are the record of it. A release's state moves by compare-and-set
(``advance``): ``UPDATE … WHERE state IN (expected)``, and a lost race is an error, never a
silent overwrite.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from releases.models import Release, ReleaseEvent
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

# The kinds of ReleaseEvent written here and by the watchdog (free text, no choices).
EVENT_KINDS = (
    "build",
    "gate",
    "recheck",
    "void",
    "backup",
    "switch",
    "switch_failed",
    "rollback",
    "rollback_failed",
    "rollback_requested",
    "rollback_refused",
    "cleanup",
    "notify",
    "watchdog",
    "baseline_check",  # releases.baseline.check_release: the stage and its verdict
)

FIX_LINE_MAX = 200  # the owner's update notice carries the fix's first line, ≤200 characters


def fix_line(message: str) -> str:
    """The commit message's first line as the owner reads it: trimmed, at most 200
    characters (cut with an ellipsis)."""
    first = (message or "").strip().splitlines()[0].strip() if (message or "").strip() else ""
    return first if len(first) <= FIX_LINE_MAX else first[: FIX_LINE_MAX - 1].rstrip() + "…"


def record_release(
    *,
    build_id: str,
    kind: str,
    commit: str,
    base_commit: str = "",
    path: str = "",
    message: str = "",
    now: datetime | None = None,
) -> Release:
    """The row of a new build (state ``built``). A build id already recorded is the same
    immutable build: its row is returned unchanged unless it was removed, in which case it
    is built again (state back to ``built``, new path)."""
    if kind not in Release.Kind.values:
        raise YimiError("invalid_request", f"unknown release kind {kind!r}")
    when = now or timezone.now()
    with transaction.atomic():
        release, created = Release.objects.select_for_update().get_or_create(
            build_id=build_id,
            defaults={
                "kind": kind, "commit": commit, "base_commit": base_commit, "path": path,
                "fix_line": fix_line(message), "created_at": when,
            },
        )
        if not created and release.state == Release.State.REMOVED:
            release.state, release.state_reason, release.path = Release.State.BUILT, "built again", path
            release.base_commit, release.gate_result = base_commit, None
            release.save(update_fields=["state", "state_reason", "path", "base_commit", "gate_result"])
        if created:
            record_event("build", release=release, to_build=build_id, details={"commit": commit, "base": base_commit}, now=when)
    return release


def advance(release: Release, to: str, *, expected: tuple[str, ...], reason: str = "", **fields: Any) -> Release:
    """Move ``release`` to state ``to`` if it is in one of ``expected``.

    Steps: 1. ``UPDATE … SET state = to WHERE id = … AND state IN expected``; 2. one row
    updated: reload and return; none: someone else moved it first (or it never was in an
    expected state) — ``release_state_changed``, nothing written.
    """
    updated = Release.objects.filter(id=release.id, state__in=expected).update(state=to, state_reason=reason, **fields)
    if updated != 1:
        current = Release.objects.filter(id=release.id).values_list("state", flat=True).first()
        raise YimiError(
            "release_state_changed",
            f"release {release.build_id} is {current!r}, not one of {', '.join(expected)}; it was not moved to {to}",
        )
    release.refresh_from_db()
    return release


def record_event(
    kind: str,
    *,
    release: Release | None = None,
    build_id: str = "",
    from_build: str = "",
    to_build: str = "",
    reason: str = "",
    details: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> ReleaseEvent:
    """Append one line to the release history. ``build_id`` finds the release row when
    ``release`` is not given (none recorded: the event has no release)."""
    if release is None and build_id:
        release = Release.objects.filter(build_id=build_id).first()
    event = ReleaseEvent.objects.create(
        release=release, kind=kind, from_build=from_build, to_build=to_build, reason=reason,
        details=details or {}, at=now or timezone.now(),
    )
    log_event("release_event", logging.INFO, kind=kind, from_build=from_build, to_build=to_build)
    return event


def journal(kind: str, fields: dict[str, Any]) -> None:
    """``releases.pointers``' journal: a pointer move recorded as a ``ReleaseEvent``.
    ``fields`` has ``from_build``, ``to_build``, ``reason`` and any details."""
    fields = dict(fields)
    subject = fields.get("to_build") or fields.get("from_build") or ""
    record_event(
        kind,
        build_id=str(subject),
        from_build=str(fields.pop("from_build", "") or ""),
        to_build=str(fields.pop("to_build", "") or ""),
        reason=str(fields.pop("reason", "") or ""),
        details=fields,
    )


def mark_removed(build_id: str) -> None:
    """Cleanup deleted the release's directory: its row says so (any state)."""
    Release.objects.filter(build_id=build_id).update(state=Release.State.REMOVED, state_reason="cleanup", path="")


def mark_rolled_back(build_id: str, reason: str) -> None:
    """The release that was live was rolled back (compare-and-set from ``switched``; a
    release without a row, or in another state, is left as it is)."""
    Release.objects.filter(build_id=build_id, state=Release.State.SWITCHED).update(
        state=Release.State.ROLLED_BACK, state_reason=reason[:2000]
    )


def releases_by_build(build_ids: list[str]) -> dict[str, Release]:
    return {r.build_id: r for r in Release.objects.filter(build_id__in=[b for b in build_ids if b])}
