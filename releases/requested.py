"""Rollback on request (flow F6): the owner says, in any words, that they
do not want this version. The request, with those words as the reason, is queued and
executed at the next idle moment — only if the running version is still the one most
recently switched in; otherwise it is refused and the owner is told why (so saying it
twice never switches back to the version just taken away).

A rollback replaces code and configuration only: it never restores the database and never
undoes what was already done outside (messages sent, payments made); the owner's notice
says so. Before switching back, the core memory is projected for the old version
(``releases.memory_bridge``).

The only code that writes ``RollbackRequest``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils import timezone

from accounts.services import is_owner
from releases import baseline, memory_bridge, notices, pointers
from releases import services as release_services
from releases.models import Release
from releases.request_models import RollbackRequest
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

REASON_MAX = 2000
INTERRUPTED_AFTER = timedelta(minutes=15)  # far longer than a rollback's stop, start and verify
WHAT_A_ROLLBACK_IS = (
    "Only code and configuration were replaced: the database was not restored, and nothing already done "
    "outside (messages sent, payments made) was undone."
)


def request_rollback(owner: Any, reason: str, *, root: Path | None = None, now: datetime | None = None) -> RollbackRequest:
    """Queue the owner's request to go back to the previous version.

    Steps: 1. only the owner may ask, and the reason (their words) must be given;
    2. the version it would go back to must not be one whose protected-baseline card the
    owner refused or has not answered (``releases.baseline.require_rollback_target``:
    ``baseline_refused``, ``baseline_waiting``); 3. one request waits at a time: a second
    one while the first waits is the same request (returned as it is); 4. the request records the build that is current now, the one the
    owner does not want, and a ``rollback_requested`` event."""
    if not is_owner(owner):
        raise YimiError("forbidden", "only the owner can ask to go back to the previous version")
    reason = (reason or "").strip()
    if not reason:
        raise YimiError("invalid_request", "say why (the owner's own words are the reason)")
    if len(reason) > REASON_MAX:
        raise YimiError("invalid_request", f"the reason is at most {REASON_MAX} characters")
    now_live = pointers.read_pointers(root)
    baseline.require_rollback_target(now_live.previous_build)
    current = now_live.current_build or ""
    with transaction.atomic():
        waiting = RollbackRequest.objects.select_for_update().filter(owner=owner, state=RollbackRequest.State.PENDING).first()
        if waiting is not None:
            return waiting
        request = RollbackRequest.objects.create(owner=owner, reason=reason, from_build=current, requested_at=now or timezone.now())
        release_services.record_event("rollback_requested", build_id=current, from_build=current, reason=reason,
                                      details={"request_id": str(request.id)}, now=now)
    log_event("rollback_requested", request_id=str(request.id))
    return request


@dataclass(frozen=True)
class Outcome:
    request: RollbackRequest
    state: str
    detail: str


def latest_switch(root: Path | None = None) -> str | None:
    """The build most recently switched in (from the pointer history), or None."""
    for row in reversed(pointers.read_history(root)):
        if row.get("kind") == "switch":
            return str(row.get("to_build") or "") or None
    return None


def refusal(request: RollbackRequest, current: pointers.Pointers, switched_in: str | None) -> str:
    """Why this request must not run now, or '' when it may."""
    if current.current_build is None:
        return "no release is current on this host"
    if current.previous_build is None:
        return "there is no previous version to go back to"
    if request.from_build and current.current_build != request.from_build:
        return f"the running version changed since you asked (it is now {current.current_build}); nothing was switched"
    if switched_in != current.current_build:
        return ("the running version is not the one most recently switched in (it is already an earlier version), "
                "so going back again would not undo the last change; nothing was switched")
    return ""


def execute_pending(
    *,
    idle_check: Callable[[], Sequence[Any]],
    services: Sequence[pointers.Service],
    root: Path | None = None,
    verify: pointers.Verify | None = None,
    now: datetime | None = None,
) -> list[Outcome]:
    """Execute waiting requests, if the host is idle now (the Celery task's body).

    Steps: 1. nothing waiting, or ``idle_check()`` names something that blocks (the release
    helper's ``releases.idle.blockers``): nothing happens (they wait for the next idle
    moment); 2. claim the oldest (``pending`` → ``executing``; a worker that
    loses the race skips it); 3. refused when the running version is not the one the owner
    asked about or not the latest switch (``refusal``), or when the previous version is one
    whose protected-baseline card was refused or is unanswered; 4. otherwise
    ``rollback_to_previous`` with ``expected_current`` = the requested build (a switch in
    between: ``current_changed``, refused), projecting the core memory for the old version
    first; 5. ``executed`` or ``failed``; the owner is told either way, with what a
    rollback does and does not do.
    """
    settle_interrupted(now=now)
    if not RollbackRequest.objects.filter(state=RollbackRequest.State.PENDING).exists():
        return []
    blocking = list(idle_check())
    if blocking:
        log_event("rollback_request_waits", blockers=",".join(str(b) for b in blocking)[:500])
        return []
    outcomes = []
    for request in RollbackRequest.objects.filter(state=RollbackRequest.State.PENDING).order_by("requested_at"):
        claimed = RollbackRequest.objects.filter(id=request.id, state=RollbackRequest.State.PENDING).update(
            state=RollbackRequest.State.EXECUTING, claimed_at=now or timezone.now()
        )
        if claimed != 1:
            continue
        outcomes.append(_execute(request, services=services, root=root, verify=verify, now=now))
    return outcomes


def settle_interrupted(*, now: datetime | None = None) -> int:
    """A request whose executor died mid-way stays ``executing``: after
    ``INTERRUPTED_AFTER`` it is ``failed`` ("interrupted"), never run again, and the owner
    is told to check; whether the pointers moved is in the release history."""
    now = now or timezone.now()
    settled = 0
    for request in RollbackRequest.objects.filter(state=RollbackRequest.State.EXECUTING, claimed_at__lt=now - INTERRUPTED_AFTER):
        _finish(request, RollbackRequest.State.FAILED,
                "it was interrupted while being carried out; it is not tried again (the release history says whether the version changed)",
                now=now)
        settled += 1
    return settled


def _execute(request: RollbackRequest, *, services: Sequence[pointers.Service], root: Path | None,
             verify: pointers.Verify | None, now: datetime | None) -> Outcome:
    now = now or timezone.now()
    live = pointers.read_pointers(root)
    why_not = refusal(request, live, latest_switch(root))
    if not why_not:
        try:
            baseline.require_rollback_target(live.previous_build)  # checked again: the answer may have changed
        except YimiError as exc:
            why_not = exc.message
    if why_not:
        return _finish(request, RollbackRequest.State.REFUSED, why_not, now=now)

    def project_memory(before: pointers.Pointers) -> None:
        assert before.previous is not None
        memory_bridge.project_for(before.previous.path, request.owner_id)

    try:
        result = pointers.rollback_to_previous(
            f"the owner asked: {request.reason}", services=services, verify=verify, root=root,
            expected_current=request.from_build or pointers.ANY, before_switch=project_memory,
        )
    except YimiError as exc:  # current_changed, no_previous_release: the host moved on
        return _finish(request, RollbackRequest.State.REFUSED, f"{exc.message}; nothing was switched", now=now)
    except Exception as exc:  # noqa: BLE001 - e.g. the memory projection failed: nothing was switched
        return _finish(request, RollbackRequest.State.FAILED, f"{type(exc).__name__}: {exc}; nothing was switched", now=now)
    if not result.ok:
        return _finish(request, RollbackRequest.State.FAILED,
                       "going back was tried once and did not verify: " + "; ".join(result.problems), now=now, to_build=result.to_build)
    _mark_rolled_back(result.from_build, request.reason)
    return _finish(request, RollbackRequest.State.EXECUTED, f"back on {result.to_build}", now=now, to_build=result.to_build)


def _mark_rolled_back(build_id: str | None, reason: str) -> None:
    release = Release.objects.filter(build_id=build_id or "").first()
    if release is None:
        return
    try:
        release_services.advance(release, Release.State.ROLLED_BACK, expected=(Release.State.SWITCHED,), reason=f"the owner asked: {reason}")
    except YimiError as exc:  # its row was moved already (the record; the pointers are the truth)
        log_event("rollback_request_row_unchanged", logging.INFO, error=exc.code)


def _finish(request: RollbackRequest, state: str, detail: str, *, now: datetime, to_build: str = "") -> Outcome:
    """``executing`` → the outcome, the history line and the owner's notice. A request no
    longer ``executing`` (settled as interrupted meanwhile, or the reverse) is left as it is:
    only the first outcome is recorded and told."""
    with transaction.atomic():
        changed = RollbackRequest.objects.filter(id=request.id, state=RollbackRequest.State.EXECUTING).update(
            state=state, state_reason=detail[:2000], decided_at=now, to_build=to_build
        )
        if changed != 1:
            request.refresh_from_db()
            log_event("rollback_request_already_finished", request_id=str(request.id), state=request.state)
            return Outcome(request, request.state, request.state_reason)
        kind = {"executed": "rollback_request_done", "refused": "rollback_refused", "failed": "rollback_failed"}[state]
        release_services.record_event(kind, build_id=request.from_build, from_build=request.from_build, to_build=to_build,
                                      reason=detail, details={"request_id": str(request.id)}, now=now)
    if state == RollbackRequest.State.EXECUTED:
        text = f"As you asked («{request.reason[:200]}»), Yimi went back to the previous version. {WHAT_A_ROLLBACK_IS}"
    elif state == RollbackRequest.State.REFUSED:
        text = f"Your request to go back to the previous version («{request.reason[:200]}») was not carried out: {detail}."
    else:
        text = f"Going back to the previous version («{request.reason[:200]}») did not work: {detail}. It is not tried again."
    try:
        entry = notices.notify_owner(f"rollback-request:{request.id}", f"rollback_{state}", text, owner_id=request.owner_id)
    except Exception as exc:  # noqa: BLE001 - the outcome stands; the console shows it
        entry = None
        log_event("rollback_request_notice_failed", logging.WARNING, error=type(exc).__name__)
    if entry is not None:
        RollbackRequest.objects.filter(id=request.id).update(notice=entry)
    request.refresh_from_db()
    log_event("rollback_request_finished", request_id=str(request.id), state=state)
    return Outcome(request, state, detail)
