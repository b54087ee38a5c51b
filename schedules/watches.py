"""Watches ("快递到了告诉我"): the only code that writes ``Watch`` and ``WatchNotice``.

Each check is a real run with ``origin=scheduled`` (``brain.services.create_scheduled_run``,
executed here, not by the runner) that calls the watch's pack tool through the gateway
(``capabilities.client.call_tool``: decide → MCP → receipt), so a watch can do nothing a
scheduled task may not. The state is read from the stored receipt at ``state_path`` —
only from a ``succeeded`` receipt: an unknown or failed check changes nothing and never
notifies. It notifies iff the last state is empty or ``s_from`` and the current one is
``s_to``.

A notice is first written: a ``notice`` timeline entry (code ``watch``) and a pending
``WatchNotice`` (its id is the notice id), with ``last_state``, in one transaction; then it
is sent. It is cleared only when a device ACKs that entry (``devices.services.acknowledge``
→ ``acknowledge_entry``). Until then every later check of the watch first sends it again,
with the same notice id and entry: a crash or a failed push between writing and delivering
loses nothing and never makes a second notice.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from brain.models import Run
from brain.services import close_scheduled_run, create_scheduled_run
from capabilities.client import call_tool
from memory.models import TimelineEntry
from memory.timeline.entries import append_entry
from schedules.models import Watch, WatchNotice
from schedules.queries import acknowledge_sql
from yimi_project import push
from yimi_project.errors import YimiError
from yimi_project.infra import statements
from yimi_project.logs import log_event

MIN_INTERVAL_SECONDS = 60
NOTICE_PREFIX = "📦 "
BATCH = 50


@dataclass
class WatchCheck:
    """What one check came to."""

    state: str | None  # None: no state could be read (the tool did not succeed)
    code: str
    notice: WatchNotice | None = None
    resent: list[Any] = field(default_factory=list)


def create_watch(
    owner: Any, device: Any, *, label: str, tool: str, arguments: dict[str, Any], s_from: str, s_to: str,
    state_path: str = "content.state", interval_seconds: int = 600, now: datetime | None = None,
    once: bool = False, last_state: str = "",
) -> Watch:
    """Store a watch for ``owner``, first checked one interval from ``now``. ``once``: it
    notifies at most once (``_record``); ``last_state``: the state already known (a
    geofence created while the owner is already inside does not notify until they leave
    and come back)."""
    now = now or timezone.now()
    if device.owner_id != owner.pk:
        raise YimiError("forbidden", "a watch runs on one of the owner's own devices")
    if "__" not in tool or not isinstance(arguments, dict):
        raise YimiError("invalid_request", "tool is pack__tool and arguments an object")
    if not s_to or s_from == s_to or interval_seconds < MIN_INTERVAL_SECONDS or not state_path.strip():
        raise YimiError("invalid_request", "s_to must differ from s_from, the interval be at least 60 s, a state path given")
    return Watch.objects.create(
        owner=owner, device=device, label=label[:200], tool=tool, arguments=arguments, state_path=state_path.strip(),
        s_from=s_from, s_to=s_to, interval_seconds=interval_seconds, next_run_at=now + timedelta(seconds=interval_seconds),
        once=once, last_state=last_state[:64],
    )


def cancel_watch(owner: Any, watch_id: Any) -> bool:
    try:
        wid = uuid.UUID(str(watch_id))
    except ValueError:
        return False
    return bool(Watch.objects.filter(id=wid, owner=owner, active=True).update(active=False, cancelled_at=timezone.now()))


def read_state(receipt: Any, path: str) -> str | None:
    """The value at a dotted path (list indexes as numbers) of a receipt, as a string."""
    node = receipt
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return None if node is None or isinstance(node, dict | list) else str(node)


def run_due_watches(now: datetime | None = None) -> int:
    """Check every active watch that is due; returns how many were checked. Each is claimed
    first by compare-and-set on its ``next_run_at``, so two beats never check it twice."""
    now = now or timezone.now()
    checked = 0
    for watch in Watch.objects.filter(active=True, next_run_at__lte=now).order_by("next_run_at")[:BATCH]:
        nxt = max(watch.next_run_at + timedelta(seconds=watch.interval_seconds), now + timedelta(seconds=1))
        if not Watch.objects.filter(id=watch.id, active=True, next_run_at=watch.next_run_at).update(next_run_at=nxt):
            continue
        try:
            check_watch(watch.id, now=now)
            checked += 1
        except Exception as exc:  # noqa: BLE001 - one broken watch must not block the others
            log_event("watch_check_failed", logging.ERROR, watch_id=str(watch.id), error=type(exc).__name__)
    return checked


def check_watch(watch_id: Any, *, now: datetime | None = None) -> WatchCheck:
    """One check of a watch (synchronous: beat, a worker, a test).

    Steps: 1. send again every pending notice of this watch (same notice id); 2. close a
    run an interrupted check left running, and create this check's scheduled run;
    3. call the tool through the gateway; 4. close the run; 5. with a succeeded receipt,
    read the state and, under a row lock on the watch, write the notice when the state
    moved (``_record``); 6. send it after commit.
    """
    now = now or timezone.now()
    watch = Watch.objects.select_related("device").get(id=watch_id)
    resent = [n.id for n in WatchNotice.objects.filter(watch=watch, state=WatchNotice.State.PENDING).order_by("created_at") if send_notice(n.id)]
    if watch.last_run_id is not None:
        close_scheduled_run(watch.last_run_id, state=Run.State.FAILED, error_code="watch_interrupted")
    run = create_scheduled_run(watch.device, f"⏱ {watch.label}: {watch.tool}", executor="watch")
    Watch.objects.filter(id=watch.id).update(last_run=run)
    outcome = async_to_sync(call_tool)(str(run.id), f"watch:{watch.id}", watch.tool, dict(watch.arguments))
    receipt = outcome.receipt or {}
    succeeded = receipt.get("status") == "succeeded"
    close_scheduled_run(run.id, state=Run.State.SUCCEEDED if succeeded else Run.State.FAILED, error_code="" if succeeded else outcome.code)
    state = read_state(receipt, watch.state_path) if succeeded else None
    if state is None:
        Watch.objects.filter(id=watch.id).update(last_checked_at=now)
        log_event("watch_checked", watch_id=str(watch.id), code=outcome.code, state=None)
        return WatchCheck(None, outcome.code if not succeeded else "no_state", resent=resent)
    notice = _record(watch.id, state, now)
    if notice is not None:
        send_notice(notice.id)
    log_event("watch_checked", watch_id=str(watch.id), code=outcome.code, state=state, notified=notice is not None)
    return WatchCheck(state, "ok", notice=notice, resent=resent)


def observe_state(watch_id: Any, state: str, *, now: datetime | None = None) -> WatchNotice | None:
    """A state the platform observed itself for an active watch (a geofence's inside or
    outside on each location report, ``schedules.geofences``), without calling the tool:
    recorded by the same rule as a check (``_record``, under the watch's row lock, so two
    reports at once notify once), and a new notice is sent. Returns the notice, if any."""
    now = now or timezone.now()
    if not Watch.objects.filter(id=watch_id, active=True).exists():
        return None
    notice = _record(watch_id, state, now)
    if notice is not None:
        send_notice(notice.id)
    log_event("watch_observed", watch_id=str(watch_id), state=state, notified=notice is not None)
    return notice


@transaction.atomic
def _record(watch_id: Any, state: str, now: datetime) -> WatchNotice | None:
    watch = Watch.objects.select_for_update().get(id=watch_id)
    notify = watch.last_state in ("", watch.s_from) and state == watch.s_to
    if notify and watch.once and WatchNotice.objects.filter(watch=watch).exists():
        notify = False  # a one-time watch has notified already
    notice = None
    if notify:
        entry = append_entry(
            owner_id=watch.owner_id, kind=TimelineEntry.Kind.NOTICE, text=f"{NOTICE_PREFIX}{watch.label}: {watch.s_to}",
            scope="owner", notice_code="watch",
        )
        notice = WatchNotice.objects.create(watch=watch, owner_id=watch.owner_id, entry=entry)
    Watch.objects.filter(id=watch.id).update(last_state=state, last_checked_at=now)
    return notice


def send_notice(notice_id: Any) -> bool:
    """Send a pending notice to the owner's devices (``notice`` with its ``notice_id``, then
    ``timeline.new``); False if it is no longer pending or the push failed (it stays pending
    and goes again at the next check)."""
    notice = WatchNotice.objects.filter(id=notice_id, state=WatchNotice.State.PENDING).select_related("entry").first()
    if notice is None:
        return False
    entry = notice.entry
    try:
        push.announce_sync(notice.owner_id, seq=entry.seq, code="watch", text=entry.text, notice_id=str(notice.id))
    except Exception as exc:  # noqa: BLE001 - the notice is stored and pending; the next check sends it again
        log_event("watch_notice_send_failed", logging.WARNING, notice_id=str(notice.id), error=type(exc).__name__)
        return False
    WatchNotice.objects.filter(id=notice.id).update(sends=F("sends") + 1, last_sent_at=timezone.now())
    return True


def acknowledge_entry(entry_id: Any) -> int:
    """A device ACKed the timeline entry ``entry_id``: its pending notice is delivered
    (conditional UPDATE; called by ``devices.services.acknowledge``/``record_delivery``), and if one was,
    a one-time watch of that notice ends (``active`` = false). Returns the notices
    delivered. The ORM's ``filter(entry_id=…, state=pending).update(state=delivered,
    delivered_at=now)`` and ``Watch.objects.filter(once=True, active=True,
    notices__entry_id=…).update(active=False)``; on every ACK, so on PostgreSQL their SQL is
    built once (``schedules.queries.acknowledge_sql``), values prepared by the fields as the
    ORM does (``update`` fires no signals; neither model has an ``auto_now`` field)."""
    now = timezone.now()
    if not statements.on_postgresql():
        delivered: int = WatchNotice.objects.filter(entry_id=entry_id, state=WatchNotice.State.PENDING).update(
            state=WatchNotice.State.DELIVERED, delivered_at=now
        )
        if delivered:  # a one-time watch has done its job once its notice is delivered
            Watch.objects.filter(once=True, active=True, notices__entry_id=entry_id).update(active=False)
        return delivered
    notice_sql, watch_sql = acknowledge_sql()
    meta = WatchNotice._meta
    entry = meta.get_field("entry").get_db_prep_value(entry_id, connection)  # type: ignore[union-attr]
    with connection.cursor() as cursor:
        cursor.execute(
            notice_sql,
            [WatchNotice.State.DELIVERED.value,
             meta.get_field("delivered_at").get_db_prep_save(now, connection),  # type: ignore[union-attr]
             entry, WatchNotice.State.PENDING.value],
        )
        delivered = cursor.rowcount
        if delivered:  # a one-time watch has done its job once its notice is delivered
            cursor.execute(watch_sql, [False, entry])
    return delivered
