"""Runs: the only code that writes ``Run``. It owns a run's life in the database: an
utterance admitted with its timeline entry and its run in one transaction
(``accept_utterance``, ``accept_voice_utterance``) or a scheduled run created
(``create_scheduled_run``), the claim and its heartbeat (``claim_for_turn``, ``heartbeat``), the outcome stored only while the claim
is still the run's (``finish_run``, ``store_reply_once``), the turn's thinking switch
(``record_thinking``), expiry, and the runs the recovery sweep must send again
(``runs_to_recover``, ``mark_requeued``). Two columns are written by their own modules:
``tool_calls_used`` by ``brain.agents`` (the run tree's tool budget) and ``model_roles`` by
``brain.run_pins`` (llm's role pin, registered with ``llm.roles``).

State transitions are conditional UPDATEs (compare-and-set); a transition that finds
the row in another state did not happen, and the caller backs off. The hot ones are one
hand-built statement each on PostgreSQL (built in ``brain.queries``); SQLite, the embedded
default, takes the ORM for them.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, F, JSONField, OuterRef, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from accounts.models import AdmissionRecord, Device, VoiceCall
from accounts.services import admit_scheduled, text_admission, voice_admission
from brain import queries
from brain.agents import ACTIVE, run_has_active_agents
from brain.models import AgentTask, Run
from brain.trace import now_ms
from capabilities.authorities import RunBinding
from capabilities.models import ReceiptRecord
from memory import queries as memory_queries
from memory.models import ImageRecord, TimelineEntry
from memory.timeline import entries as timeline
from yimi_project.infra import statements

NOTICE_TEXT = {
    "brain_timeout": "I couldn't answer this: my brain did not respond in time. Nothing was answered; please ask again.",
    "brain_unreachable": "I couldn't answer this: my brain could not be reached. Nothing was answered; please ask again.",
    "brain_error": "I couldn't answer this: my brain returned an error. Nothing was answered; please ask again.",
    "brain_bad_response": "I couldn't answer this: my brain's answer broke off or was unreadable. Nothing was answered; please ask again.",
    "brain_not_configured": "I couldn't answer this: my model settings cannot be used right now (the console's model settings page says why). Nothing was answered.",
    "run_expired": "This message waited more than 3 minutes and was not answered in time, so I won't answer it late. Ask again if it still matters.",
}


@dataclass(frozen=True)
class AcceptedUtterance:
    entry: TimelineEntry
    run_id: Any
    duplicate: bool


def accept_utterance(
    device: Device, client_id: str, text: str, *, thinking: bool | None = None, received_ms: float | None = None
) -> AcceptedUtterance:
    """Store an inbound text utterance and create its run, in one transaction.

    Steps: 1. a resend with a known (device, client id) returns the stored entry and
    its run: nothing new; 2. admission decides the scope; 3. the entry is appended to
    the timeline; 4. the run is created, bound to the admission record. The run is
    dispatched by the caller after commit; a crash in between is healed by recovery.
    ``thinking`` is the front's per-turn thinking switch, if it sent one (else the main
    turn decides it from the words, ``brain.prompts.decide_thinking``). ``received_ms`` is
    when the frame reached the consumer: the run's trace (``brain.trace``) starts with it.
    """
    return _accept(device, client_id, text, text_admission(device), thinking, received_ms)


def accept_voice_utterance(
    device: Device, client_id: str, text: str, *, scope: str, reason: str, thinking: bool | None = None
) -> AcceptedUtterance:
    """The same for a spoken request, except step 2: the scope was decided from the audio
    (``accounts.voice.decide_speaker``) and is admitted by ``accounts.services.voice_admission``.
    ``client_id`` is the utterance's id, so a resent transcript stores nothing new."""
    return _accept(device, client_id, text, voice_admission(device, scope=scope, reason=reason), thinking)


def _accept(
    device: Device, client_id: str, text: str, admission: AdmissionRecord, thinking: bool | None = None,
    received_ms: float | None = None,
) -> AcceptedUtterance:
    """Store ``admission``, the entry with the owner's next sequence number and the run, all
    or nothing. On PostgreSQL that is one statement (``statements.insert_parts`` of
    ``brain.queries.accept_parts``: the admission, the counter's upsert, the entry and the run
    as data-modifying WITH queries, atomic without BEGIN and COMMIT; inside a caller's
    transaction, under a savepoint); elsewhere the same rows one statement each, in a
    transaction. They were six round trips.

    Step 1 is the unique (device, client id) constraint itself, not a lookup first: a
    resend (rare: a reconnect) fails the entry's INSERT, the whole statement or transaction
    rolls back (admission and sequence number too, no gap) and the stored entry is read
    then (tests/brain/test_admission_queries.py)."""
    entry = TimelineEntry(
        owner_id=device.owner_id, seq=0, kind=TimelineEntry.Kind.UTTERANCE, text=text, device_id=device.id, client_id=client_id,
        scope=admission.scope,
    )
    trace = {"received": received_ms} if received_ms is not None else {}
    trace["admitted"] = now_ms()
    run = Run(
        owner_id=device.owner_id, admission=admission, inbound=entry, origin_device=device, scope=admission.scope,
        thinking=thinking, trace=trace,
    )
    try:  # in autocommit one statement needs no transaction (inside atomic() autocommit is off)
        with contextlib.nullcontext() if connection.get_autocommit() else transaction.atomic():
            if not statements.insert_parts(*queries.accept_parts(admission, entry, run)):
                with transaction.atomic(savepoint=False):  # a transaction of its own, if it has none yet
                    statements.insert(admission)
                    entry.seq = timeline.next_seq(device.owner_id)
                    statements.insert(entry)
                    run.inbound = entry
                    statements.insert(run)
    except IntegrityError:
        # A resend of a stored frame, or the same frame racing itself (two sockets of one
        # device) and the other one won.
        existing = timeline.find_by_client_id(device.id, client_id)
        if existing is None:
            raise
        return _duplicate(existing)
    return AcceptedUtterance(entry=entry, run_id=run.id, duplicate=False)


def _duplicate(entry: TimelineEntry) -> AcceptedUtterance:
    run_id = Run.objects.filter(inbound=entry).values_list("id", flat=True).first()
    return AcceptedUtterance(entry=entry, run_id=run_id, duplicate=True)


def run_binding(run_id: Any) -> RunBinding | None:
    """The gateway's binding of a call to its run (``capabilities.authorities.bind_run``,
    registered by ``BrainConfig.ready``); None when there is no such run. A run counts as
    live while its sub-agents work."""
    try:
        key = uuid.UUID(str(run_id))
    except ValueError:
        return None
    run = statements.fetch_by_pk(Run, key, ("owner", "admission", "scope", "state", "origin"))  # on every gateway call
    if run is None:
        return None
    active = run.state in (Run.State.QUEUED, Run.State.RUNNING) or run_has_active_agents(key)
    return RunBinding(key, run.owner_id, run.admission_id, run.scope, active, run.origin)


@dataclass(frozen=True)
class Claimed:
    """A run just claimed (its inbound entry loaded), and what the claim's statement also
    read for its turn: whether its device is in an open voice call (else there is no call
    snapshot to look for) and whether an attached image names its request (else
    ``memory.personal.images.image_for_request`` skips that lookup)."""

    run: Run
    in_call: bool
    image_linked: bool
    tasks_working: bool = True  # the owner has background tasks still working (else none to list)
    pack_results: bool = True  # the run's tree has pack receipts (else its report is empty)


def claim_run(run_id: Any) -> Run | None:
    """Take a run for execution: queued, or running with a stale heartbeat (its worker
    died). Returns None when another worker holds it or it has finished."""
    claimed = claim_for_turn(run_id)
    return claimed.run if claimed is not None else None


def claim_for_turn(run_id: Any, *, pin: dict[str, Any] | None = None) -> Claimed | None:
    """``claim_run`` as the runner uses it: the compare-and-set UPDATE (queued, or running on
    a stale heartbeat → running, attempts + 1; a row count of 0 means another worker holds the
    run or it finished) and the run's inbound entry with the facts ``Claimed`` holds. On
    PostgreSQL one statement (``brain.queries.claim_sql``: the UPDATE returns the run's
    columns, joined with the entry and the facts); SQLite (the embedded default) takes the
    ORM: the UPDATE, then the run, its entry and the facts (``Exists``) in one query, in a
    transaction.

    ``pin``: the model roles to pin the run to (``llm.roles.pin_of``), written by the
    same UPDATE unless the run has a pin (``model_roles = COALESCE(model_roles, pin)``: a
    run claimed again keeps the roles it started with); the returned run's ``model_roles``
    is the pin that holds. One statement where the claim and the pin took two."""
    try:
        key = uuid.UUID(str(run_id))
    except ValueError:
        return None
    now = timezone.now()
    stale = now - timedelta(seconds=settings.RUN_HEARTBEAT_STALE_SECONDS)
    if not statements.on_postgresql():
        return _claim_with_orm(key, now, stale, pin)
    ops = connection.ops
    sql = queries.claim_sql(ACTIVE)
    pinned = None if pin is None else Run._meta.get_field("model_roles").get_db_prep_save(pin, connection)  # type: ignore[union-attr]
    params = [
        Run.State.RUNNING, ops.adapt_datetimefield_value(now), ops.adapt_datetimefield_value(now), pinned,
        Run._meta.pk.get_db_prep_value(key, connection),  # type: ignore[union-attr]
        Run.State.QUEUED, Run.State.RUNNING, ops.adapt_datetimefield_value(stale),
    ]
    rows = statements.fetch(sql.sql, [*params, *sql.facts], sql.run_fields + sql.entry_fields)
    if not rows:
        return None
    n, m = len(sql.run_fields), len(sql.entry_fields)
    run = statements.instance(Run, sql.run_fields, rows[0][:n])
    run.inbound = statements.instance(TimelineEntry, sql.entry_fields, rows[0][n:n + m])
    in_call, image_linked, tasks_working, pack_results = (bool(v) for v in rows[0][n + m:])
    return Claimed(run, in_call, image_linked, tasks_working, pack_results)


def _claim_with_orm(key: uuid.UUID, now: datetime, stale: datetime, pin: dict[str, Any] | None) -> Claimed | None:
    """``claim_for_turn`` on SQLite: the same compare-and-set by the ORM, and the claimed run
    read back in the same transaction (no other claim can come between)."""
    changes: dict[str, Any] = {"state": Run.State.RUNNING, "attempts": F("attempts") + 1, "started_at": now, "heartbeat_at": now}
    if pin is not None:
        changes["model_roles"] = Coalesce("model_roles", Value(pin, output_field=JSONField()))
    waiting = Q(state=Run.State.QUEUED) | Q(state=Run.State.RUNNING, heartbeat_at__lt=stale)
    with transaction.atomic():
        if Run.objects.filter(waiting, id=key).update(**changes) != 1:
            return None
        run = (
            Run.objects.select_related("inbound")
            .annotate(
                in_call=Exists(VoiceCall.objects.filter(device=OuterRef("origin_device"), ended_at=None)),
                image_linked=Exists(
                    ImageRecord.objects.filter(
                        device=OuterRef("origin_device"), state=ImageRecord.State.ATTACHED,
                        about_client_id=OuterRef("inbound__client_id"),
                    ).exclude(path="")
                ),
                tasks_working=Exists(
                    AgentTask.objects.filter(run__owner=OuterRef("owner"), depth=1, kind=AgentTask.Kind.TASK, state__in=ACTIVE)
                ),
                pack_results=Exists(ReceiptRecord.objects.filter(call__run=OuterRef("id"), written_by_gateway=False)),
            )
            .get(id=key)
        )
    facts = [bool(run.__dict__.pop(name)) for name in ("in_call", "image_linked", "tasks_working", "pack_results")]
    return Claimed(run, *facts)


def heartbeat(run: Run) -> bool:
    """Refresh the run's heartbeat; False if the run was taken over or finished (one
    conditional UPDATE: on PostgreSQL its text built once, ``brain.queries.heartbeat_sql``;
    SQLite takes the ORM)."""
    now = timezone.now()
    if not statements.on_postgresql():
        return Run.objects.filter(id=run.id, state=Run.State.RUNNING, attempts=run.attempts).update(heartbeat_at=now) == 1
    with connection.cursor() as cursor:
        cursor.execute(
            queries.heartbeat_sql(),
            [connection.ops.adapt_datetimefield_value(now),
             Run._meta.pk.get_db_prep_value(run.id, connection),  # type: ignore[union-attr]
             Run.State.RUNNING, run.attempts],
        )
        return cursor.rowcount == 1


def is_stale(run: Run, now: datetime | None = None) -> bool:
    """Said more than ``RUN_STALE_SECONDS`` (3 minutes) before ``now``: expired, not answered."""
    return (now or timezone.now()) - run.inbound.created_at > timedelta(seconds=settings.RUN_STALE_SECONDS)


def history_for(run: Run) -> list[TimelineEntry]:
    if run.scope != "owner":
        return []
    return [
        e
        for e in timeline.recent_for_context(
            owner_id=run.owner_id, before_seq=run.inbound.seq, limit=settings.BRAIN_HISTORY_ENTRIES
        )
        if e.scope == "owner"
    ]


def finish_run(run: Run, *, state: str, text: str, kind: str, error_code: str = "") -> TimelineEntry | None:
    """Store the run's outcome (reply or notice) in the timeline and close the run.

    Steps: 1. lock the run row; 2. if it is no longer ours (taken over after a stale
    heartbeat, or already finished) store nothing and return None; 3. append the entry;
    4. move the run to its final state, with its trace (``brain.trace``: the stages the
    runner noted in memory, and ``stored``) and its turn's thinking switch (``run.thinking``
    in memory, decided at the claim; one stored already is kept, None writes none).

    On PostgreSQL outside a transaction that is one statement (``_finish_in_one_statement``);
    else the ORM, in a transaction: the lock (``select_for_update``), the append and the
    closing UPDATE (``_finish_in_steps``).
    """
    if connection.get_autocommit() and statements.in_one_statement(TimelineEntry):
        return _finish_in_one_statement(run, state=state, text=text, kind=kind, error_code=error_code)
    with transaction.atomic():
        return _finish_in_steps(run, state=state, text=text, kind=kind, error_code=error_code)


def _finish_in_steps(run: Run, *, state: str, text: str, kind: str, error_code: str) -> TimelineEntry | None:
    locked = Run.objects.select_for_update().filter(id=run.id).values_list("state", "attempts").first()
    if locked is None or locked[0] not in (Run.State.RUNNING, Run.State.QUEUED) or locked[1] != run.attempts:
        return None
    if run.trace is not None:
        run.trace.setdefault("stored", now_ms())
    entry = timeline.append_entry(
        owner_id=run.owner_id,
        kind=kind,
        text=text,
        device_id=run.origin_device_id,
        scope=run.scope,
        reply_to=run.inbound,
        notice_code=error_code if kind == TimelineEntry.Kind.NOTICE else "",
    )
    changes: dict[str, Any] = {"state": state, "finished_at": timezone.now(), "result_entry": entry, "error_code": error_code}
    if run.trace is not None:
        changes["trace"] = run.trace
    if run.thinking is not None:  # COALESCE: one stored already is kept
        changes["thinking"] = Coalesce("thinking", Value(run.thinking))
    Run.objects.filter(id=run.id).update(**changes)
    return entry


def _finish_in_one_statement(run: Run, *, state: str, text: str, kind: str, error_code: str) -> TimelineEntry | None:
    """``finish_run`` in one statement (PostgreSQL, autocommit: ``brain.queries.finish_sql``),
    where it was five round trips (BEGIN, the lock, the append, the closing UPDATE, COMMIT):
    the closing UPDATE made conditional (``state`` running or queued and ``attempts`` as
    claimed: the lock's check), the owner's next number taken only if it closed the run, and
    the entry inserted. A lost claim writes nothing and returns None."""
    entry = TimelineEntry(
        owner_id=run.owner_id, seq=0, kind=kind, text=text, device_id=run.origin_device_id, scope=run.scope,
        reply_to=run.inbound, notice_code=error_code if kind == TimelineEntry.Kind.NOTICE else "",
    )
    if run.trace is not None:
        run.trace.setdefault("stored", now_ms())
    _, values = statements.insert_values(entry)
    sql, seq = queries.finish_sql(run.trace is not None)
    close: list[Any] = [state, connection.ops.adapt_datetimefield_value(timezone.now()), error_code]
    if run.trace is not None:
        close.append(Run._meta.get_field("trace").get_db_prep_save(run.trace, connection))  # type: ignore[union-attr]
    close.append(run.thinking)
    key = Run._meta.pk.get_db_prep_value(run.id, connection)  # type: ignore[union-attr]
    gate = [key, Run.State.RUNNING, Run.State.QUEUED, run.attempts]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*close, *gate, *memory_queries.seq_upsert(run.owner_id, only_with="closed")[1],
                             *values[:seq], *values[seq + 1:]])
        row = cursor.fetchone()
    if row is None:
        return None
    entry.id, entry.seq = row
    entry._state.adding = False
    entry._state.db = connection.alias
    return entry


class TraceStamp(NamedTuple):
    """``trace_stages_update``'s UPDATE: its text and parameters, for a statement of the
    caller's own on PostgreSQL (``sql`` ends with its WHERE clause, so a condition may be
    appended), and ``run`` to run it on its own (SQLite: the ORM)."""

    sql: str
    params: list[Any]

    def run(self) -> int:
        """Merge the stages into the run's trace now; the number of runs changed (0 or 1)."""
        if statements.on_postgresql():
            with connection.cursor() as cursor:
                cursor.execute(self.sql, self.params)
                return cursor.rowcount
        stages, key = json.loads(self.params[0]), self.params[1]
        with transaction.atomic():
            stored = list(Run.objects.select_for_update().filter(id=key).values_list("trace", flat=True))
            if not stored:
                return 0
            return Run.objects.filter(id=key).update(trace={**(stored[0] or {}), **stages})


def trace_stages_update(run_id: Any, stages: dict[str, float]) -> TraceStamp:
    """The UPDATE that merges ``stages`` into a stored run's trace (``brain.trace``), stages
    already there overwritten (``brain.queries.trace_stages_sql``), and its parameters, for a
    caller that runs it inside a statement of its own (the ACK's ``done_sent`` and ``ack``:
    ``devices.services.acknowledge``'s rider), or on its own (``TraceStamp.run``; SQLite
    takes the ORM). On every reply's ACK: built once."""
    key = Run._meta.get_field("id").get_db_prep_value(uuid.UUID(str(run_id)), connection)
    return TraceStamp(queries.trace_stages_sql(), [json.dumps(stages), key])


def expire_run(run_id: Any) -> tuple[Run, TimelineEntry] | None:
    """Mark a run that is too old expired, with a notice; None if it is not ours to expire."""
    now = timezone.now()
    stale = now - timedelta(seconds=settings.RUN_HEARTBEAT_STALE_SECONDS)
    with transaction.atomic():
        run = (
            Run.objects.select_for_update()
            .filter(id=run_id)
            .filter(Q(state=Run.State.QUEUED) | Q(state=Run.State.RUNNING, heartbeat_at__lt=stale))
            .select_related("inbound")
            .first()
        )
        if run is None:
            return None
        entry = expire_claimed(run)
    return (run, entry) if entry is not None else None


def expire_claimed(run: Run) -> TimelineEntry | None:
    """Close a run we hold as expired, with the notice that says so."""
    return finish_run(
        run, state=Run.State.EXPIRED, text=NOTICE_TEXT["run_expired"], kind=TimelineEntry.Kind.NOTICE,
        error_code="run_expired",
    )


def runs_to_recover(*, now: datetime | None = None, on_queue: Collection[str] = ()) -> tuple[list[Any], list[Any]]:
    """(ids to put on the queue again, ids to expire), as of ``now``.

    Again: a queued run, or a running run whose heartbeat went stale because its worker
    died, whose latest queue message (``enqueued_at``; its creation for the first, which
    is sent right after it) is older than the sweep interval (``RUN_RECOVERY_SECONDS``) and
    that has no message on the broker any more (``on_queue``: the ids of runs that do,
    ``brain.recovery.runs_on_queue``) — its message was lost, or never sent. A run still
    waiting in a backlog is left alone, so the queue never holds more messages than there
    are runs to execute. Expire: any of them whose utterance is older than 3 minutes.
    """
    now = now or timezone.now()
    stale_heartbeat = now - timedelta(seconds=settings.RUN_HEARTBEAT_STALE_SECONDS)
    too_old = now - timedelta(seconds=settings.RUN_STALE_SECONDS)
    pending = Run.objects.filter(
        Q(state=Run.State.QUEUED) | Q(state=Run.State.RUNNING, heartbeat_at__lt=stale_heartbeat)
    ).values_list("id", "inbound__created_at", "enqueued_at", "created_at")
    again: list[Any] = []
    expire: list[Any] = []
    for run_id, said, enqueued, created in pending:
        if said < too_old:
            expire.append(run_id)
        elif _last_message_before(enqueued, created, now) and str(run_id) not in on_queue:
            again.append(run_id)
    return again, expire


def _last_message_before(enqueued: datetime | None, created: datetime, now: datetime) -> bool:
    return (enqueued or created) < now - timedelta(seconds=settings.RUN_RECOVERY_SECONDS)


def mark_requeued(run_id: Any, *, now: datetime | None = None) -> bool:
    """Record that the recovery sweep puts ``run_id`` on the queue again, at ``now``.

    Compare-and-set: only while the run still waits (queued, or running on a stale
    heartbeat) and its latest message is still older than the sweep interval; False when
    another sweep got there first (or the run moved on), and then the caller sends nothing.
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.RUN_RECOVERY_SECONDS)
    stale_heartbeat = now - timedelta(seconds=settings.RUN_HEARTBEAT_STALE_SECONDS)
    waiting = Q(state=Run.State.QUEUED) | Q(state=Run.State.RUNNING, heartbeat_at__lt=stale_heartbeat)
    last_message_old = Q(enqueued_at__lt=cutoff) | Q(enqueued_at=None, created_at__lt=cutoff)
    return Run.objects.filter(waiting, last_message_old, id=run_id).update(enqueued_at=now) == 1


def record_thinking(run_id: Any, thinking: bool) -> None:
    """Record a turn's thinking switch on a run that has none yet (the front sent none):
    one conditional UPDATE (``thinking IS NULL``), so a switch already stored is kept."""
    Run.objects.filter(id=run_id, thinking__isnull=True).update(thinking=thinking)


def store_reply_once(run: Run, text: str, claim: Any) -> TimelineEntry | None:
    """Store a reply that must exist at most once (a task's report, an approved action's
    report).

    Steps: 1. append the reply to the timeline (a reply to the run's utterance, for the
    device that spoke); 2. ``claim(entry_id)`` marks the event reported with a conditional
    UPDATE; losing that race rolls the entry back, so a second report never exists.
    """
    with transaction.atomic():
        entry = timeline.append_entry(
            owner_id=run.owner_id,
            kind=TimelineEntry.Kind.REPLY,
            text=text,
            device_id=run.origin_device_id,
            scope=run.scope,
            reply_to=run.inbound,
        )
        if not claim(entry.id):
            transaction.set_rollback(True)
            return None
    return entry


def create_scheduled_run(device: Device, text: str, *, executor: str = "runner") -> Run:
    """A scheduled task's run (``origin=scheduled``), bound to ``device``; in a transaction.

    Steps: 1. admission (``accounts.services.admit_scheduled``); 2. the task's text is
    appended to the timeline as a ``notice`` (code ``scheduled``: nobody said it);
    3. the run is created. ``executor="runner"``: queued, for ``runner.execute_run``
    (dispatched after commit; recovery heals a lost dispatch). ``executor="watch"``: already
    running with no heartbeat (the watch executes it in place; recovery never takes it)
    and closed by ``close_scheduled_run``.
    """
    with transaction.atomic():
        admission = admit_scheduled(device)
        entry = timeline.append_entry(
            owner_id=device.owner_id, kind=TimelineEntry.Kind.NOTICE, text=text, device_id=device.id,
            scope=admission.scope, notice_code="scheduled",
        )
        fields: dict[str, Any] = {}
        if executor == "watch":
            fields = {"state": Run.State.RUNNING, "attempts": 1, "started_at": timezone.now()}
        return Run.objects.create(
            owner_id=device.owner_id, admission=admission, inbound=entry, origin_device=device, scope=admission.scope,
            origin=Run.Origin.SCHEDULED, **fields,
        )


def close_scheduled_run(run_id: Any, *, state: str, error_code: str = "") -> bool:
    """Close a watch's run (running → ``state``) by conditional UPDATE; False if it was not running."""
    return bool(
        Run.objects.filter(id=run_id, state=Run.State.RUNNING, origin=Run.Origin.SCHEDULED).update(
            state=state, finished_at=timezone.now(), error_code=error_code[:32]
        )
    )
