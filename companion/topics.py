"""What a call leaves for the next one: the end-of-call summary and topic progress, and
the continuity the next call's snapshot is built with (issue 21, part two).

The only writer of ``CallSummary`` and ``TopicState``. Three entry points:

- ``summarize_call`` (the Celery task ``brain.tasks.summarize_call`` of ``companion.tasks``,
  sent at hang-up): reads the call's transcript, runs the deterministic extractor (``companion.extractor``)
  and writes one summary and its topic rows, idempotent on (call, transcript version,
  extractor version), and only if the owner's privacy epoch did not move meanwhile.
- ``continuity_for`` (called by ``companion.snapshot`` at call start): the latest summary,
  one thread to resume, the topics to avoid, details already told and the facts, these
  read from the *current* L3 versions.
- ``invalidate`` (registered with ``companion.privacy_epoch``): inside the transaction that
  moves the epoch, marks the summaries and topic rows derived from a source that was
  forgotten, edited or erased (all of them when continuity is turned off).

The call's transcript is its owner utterances (timeline entries of the call's voice
utterances, scope ``owner``; a guest's words are skipped), Yimi's replies to them, and the
opening line the snapshot froze. Entries erased meanwhile are left out, so erasing moves
the transcript version.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from accounts.models import VoiceCall
from companion import privacy_epoch, queries
from companion.extractor import COOLDOWN, EXTRACTOR_VERSION, Change, Extraction, Turn, extract, is_detail
from companion.extractor import label as topic_label
from companion.models import CallSnapshot, CallSummary, TopicState
from memory import source_changes
from memory.assertions.store import payload_text
from memory.models import Assertion, AssertionVersion, TimelineEntry
from yimi_project.infra import statements
from yimi_project.logs import log_event

SUMMARIES_READ = 3  # the latest summaries the next call looks at (the newest becomes latest_summary)
SUMMARY_IN_TEXT = 240  # of the newest summary, in latest_summary (call_snapshot keeps 400 in all)
FACTS_MAX = 8
FACT_CHARS = 120
TOPIC_ROWS_READ = 5000  # without DISTINCT ON (SQLite): newest valid rows considered per owner


# --- the end-of-call job ---------------------------------------------------------------------


@dataclass(frozen=True)
class SummaryOutcome:
    """``status``: ``written``, ``duplicate`` (this transcript and extractor were summarized
    already), ``stale_epoch`` (the epoch moved while the job ran: nothing written),
    ``continuity_off``, ``call_open`` or ``unknown_call`` (nothing written)."""

    status: str
    summary_id: int | None = None
    topics: int = 0


@dataclass(frozen=True)
class Transcript:
    turns: list[Turn]
    entries: list[TimelineEntry]  # the owner's utterances, oldest first
    version: str
    card_topic: str | None
    labels: dict[str, str]


def card_topic_key(card_id: str) -> str:
    return f"card:{card_id}"


def read_transcript(call: VoiceCall) -> Transcript:
    """The call's turns in order (module docstring) and their version: a digest of the
    opening and of every entry's id, kind and text."""
    said = list(
        TimelineEntry.objects.filter(
            owner_id=call.owner_id, kind=TimelineEntry.Kind.UTTERANCE, voice_utterance__call_id=call.pk, erased_at=None
        ).order_by("seq")
    )
    replies = list(
        TimelineEntry.objects.filter(
            owner_id=call.owner_id, kind=TimelineEntry.Kind.REPLY, reply_to_id__in=[e.id for e in said], erased_at=None
        ).order_by("seq")
    )
    snapshot = CallSnapshot.objects.filter(call_id=call.pk).values("opening", "card_id", "card_content").first()
    turns: list[Turn] = []
    labels: dict[str, str] = {}
    card_topic = None
    if snapshot is not None:
        if snapshot["opening"]:
            turns.append(Turn("yimi", snapshot["opening"]))
        if snapshot["card_id"]:
            card_topic = card_topic_key(snapshot["card_id"])
            labels[card_topic] = str((snapshot["card_content"] or {}).get("title") or snapshot["card_id"])[:80]
    for entry in sorted(said + replies, key=lambda e: e.seq):
        if entry.kind == TimelineEntry.Kind.REPLY:
            turns.append(Turn("yimi", entry.text))
        else:
            turns.append(Turn("owner" if entry.scope == "owner" else "other", entry.text, entry.id))
    digest = hashlib.sha256(
        json.dumps([snapshot["opening"] if snapshot else "", [(e.id, e.kind, e.text) for e in sorted(said + replies, key=lambda e: e.seq)]],
                   ensure_ascii=False).encode()
    ).hexdigest()[:32]
    owner_entries = [e for e in said if e.scope == "owner"]
    return Transcript(turns, owner_entries, digest, card_topic, labels)


@dataclass(frozen=True)
class CurrentState:
    """A topic's newest valid row, as ``current_states`` reads it."""

    id: int
    topic_key: str
    label: str
    state: str
    quote: str
    last_question: str
    cooldown_until: datetime | None
    source_call_id: int
    source_entry_id: int
    created_at: datetime
    position: int


CURRENT_FIELDS = tuple(f.name for f in CurrentState.__dataclass_fields__.values())


def current_states(owner_id: int, *, exclude_call: int | None = None) -> dict[str, CurrentState]:
    """Each topic's newest valid row (its state), optionally leaving one call's rows out.
    A row quoting an erased utterance was invalidated in the erasure's own transaction
    (``invalidate``), so no join to the timeline is needed here."""
    if statements.on_postgresql():  # DISTINCT ON, built once per process: companion.queries.current_states_sql
        sql, fields = queries.current_states_sql(CURRENT_FIELDS, exclude_call is not None)
        rows = statements.fetch(sql, [owner_id] if exclude_call is None else [owner_id, exclude_call], fields)
        return {row.topic_key: row for row in (CurrentState(*values) for values in rows)}
    # SQLite takes the ORM: the newest TOPIC_ROWS_READ valid rows, the newest of each topic kept
    valid = TopicState.objects.filter(owner_id=owner_id, invalidated_at__isnull=True)
    if exclude_call is not None:
        valid = valid.exclude(source_call_id=exclude_call)
    latest: dict[str, CurrentState] = {}
    for values in valid.order_by("-created_at", "-id").values_list(*CURRENT_FIELDS)[:TOPIC_ROWS_READ]:
        row = CurrentState(*values)
        latest.setdefault(row.topic_key, row)
    return latest


def _facts_of(call: VoiceCall, entries: list[TimelineEntry]) -> dict[str, dict[str, Any]]:
    """The L3 assertions whose version was read from this call's utterances: {assertion id:
    {"version", "seqs"}} (the version committed from them, and which of the call's seqs)."""
    seqs = {e.seq for e in entries}
    if not seqs:
        return {}
    facts: dict[str, dict[str, Any]] = {}
    versions = AssertionVersion.objects.filter(
        assertion__owner_id=call.owner_id, committed_at__gte=call.started_at, erased=False
    ).values_list("assertion_id", "version", "evidence").order_by("version")
    for assertion_id, version, evidence in versions:
        used = sorted(seqs.intersection(s for s in (evidence or []) if isinstance(s, int)))
        if used:
            facts[str(assertion_id)] = {"version": version, "seqs": used}
    return facts


@dataclass(frozen=True)
class Prepared:
    """What a job read and concluded before writing (``prepare``), under ``epoch``."""

    call: VoiceCall
    epoch: int
    transcript: Transcript
    extraction: Extraction
    facts: dict[str, dict[str, Any]]


def summarize_call(call_pk: int, *, now: datetime | None = None) -> SummaryOutcome:
    """Summarize one ended call and write its topic progress: ``prepare`` then ``write``."""
    prepared = prepare(call_pk)
    if isinstance(prepared, SummaryOutcome):
        return prepared
    return write(prepared, now=now)


def prepare(call_pk: int) -> Prepared | SummaryOutcome:
    """Read and extract, writing nothing.

    Steps: 1. the call exists and hung up; the owner's continuity is on; 2. note the
    owner's privacy epoch *before* reading anything; 3. read the transcript and its
    version; a summary for (call, version, ``EXTRACTOR_VERSION``) already there:
    ``duplicate``; 4. run the extractor against each topic's state before this call;
    5. find the L3 assertions committed from the call's utterances.
    """
    call = VoiceCall.objects.filter(pk=call_pk).first()
    if call is None:
        return SummaryOutcome("unknown_call")
    if call.ended_at is None:
        return SummaryOutcome("call_open")
    owner_id = call.owner_id
    if not privacy_epoch.continuity_enabled(owner_id):
        return SummaryOutcome("continuity_off")
    epoch = privacy_epoch.current(owner_id)
    transcript = read_transcript(call)
    done = CallSummary.objects.filter(call=call, transcript_version=transcript.version, extractor_version=EXTRACTOR_VERSION).first()
    if done is not None:
        return SummaryOutcome("duplicate", done.id, done.topics.count())
    prior = {key: row.state for key, row in current_states(owner_id, exclude_call=call.pk).items()}
    extraction = extract(transcript.turns, prior, card_topic=transcript.card_topic, labels=transcript.labels)
    return Prepared(call, epoch, transcript, extraction, _facts_of(call, transcript.entries))


def write(prepared: Prepared, *, now: datetime | None = None) -> SummaryOutcome:
    """Write what ``prepare`` concluded, if its epoch still holds.

    Steps, in one transaction: 1. read the epoch again with its row held
    (``privacy_epoch.read_locked``: a bump waits until we commit); if it moved since
    ``prepare`` write nothing (``stale_epoch``: what was read may come from a source that
    is gone or from before continuity was turned off); 2. mark an older summary of the same
    call (and its rows) superseded; 3. insert the summary and its topic rows. A concurrent
    job that inserted the same summary first makes this one a ``duplicate`` (unique
    constraint), with nothing written.
    """
    now = now or timezone.now()
    call, epoch, transcript, extraction = prepared.call, prepared.epoch, prepared.transcript, prepared.extraction
    owner_id = call.owner_id
    quoted = {e.id for e in transcript.entries}
    try:
        with transaction.atomic():
            if privacy_epoch.read_locked(owner_id) != epoch:
                log_event("call_summary_stale_epoch", call=call.pk, epoch=epoch)
                return SummaryOutcome("stale_epoch")
            # An older transcript of the same call (a reply stored after the first job) is superseded.
            older = CallSummary.objects.filter(call=call, invalidated_at=None)
            TopicState.objects.filter(summary__in=older, invalidated_at=None).update(invalidated_at=now, invalidated_reason="superseded")
            older.update(invalidated_at=now, invalidated_reason="superseded")
            summary = CallSummary.objects.create(
                owner_id=owner_id, call=call, transcript_version=transcript.version, extractor_version=EXTRACTOR_VERSION,
                epoch=epoch, text=extraction.summary, source_entries=extraction.owner_entries, facts=prepared.facts,
                stats=extraction.stats, created_at=now,
            )
            TopicState.objects.bulk_create(
                [_row(summary, call, c, transcript.labels, epoch, now) for c in extraction.changes if c.entry_id in quoted]
            )
    except IntegrityError:
        done = CallSummary.objects.filter(call=call, transcript_version=transcript.version, extractor_version=EXTRACTOR_VERSION).first()
        return SummaryOutcome("duplicate", done.id if done else None)
    log_event("call_summarized", call=call.pk, topics=len(extraction.changes), epoch=epoch)
    return SummaryOutcome("written", summary.id, len(extraction.changes))


def _row(summary: CallSummary, call: VoiceCall, c: Change, labels: dict[str, str], epoch: int, now: datetime) -> TopicState:
    return TopicState(
        owner_id=summary.owner_id, summary=summary, topic_key=c.topic_key, label=topic_label(c.topic_key, labels)[:80],
        state=c.state, change=c.change, last_question=c.last_question,
        cooldown_until=(call.ended_at or now) + COOLDOWN if c.state == TopicState.State.COOLDOWN else None,
        source_call=call, source_entry_id=c.entry_id, quote=c.quote, extractor_version=EXTRACTOR_VERSION, epoch=epoch,
        position=c.position, created_at=now,
    )


# --- invalidation (inside the privacy epoch's bump) ------------------------------------------


def invalidate(owner_id: int, epoch: int, reason: str, change: source_changes.SourceChange | None) -> None:
    """Mark what was derived from a source that changed, in the bump's transaction.

    Continuity turned off (or a bump that names no source): every valid summary and topic
    row of the owner. Erased timeline entries: the topic rows quoting them and the
    summaries read from them. Forgotten or edited assertions: the summaries that cite them
    and the topic rows quoting the utterances they were read from.
    """
    now = timezone.now()
    summaries = CallSummary.objects.filter(owner_id=owner_id, invalidated_at=None)
    topics = TopicState.objects.filter(owner_id=owner_id, invalidated_at=None)
    if change is None:
        s, t = summaries.update(invalidated_at=now, invalidated_reason=reason), topics.update(invalidated_at=now, invalidated_reason=reason)
        log_event("companion_progress_invalidated", owner=owner_id, epoch=epoch, reason=reason, summaries=s, topics=t)
        return
    bad_summaries: set[int] = set()
    bad_entries: set[int] = set(change.entry_ids)
    changed = set(change.assertion_ids)
    for sid, entries, facts in summaries.values_list("id", "source_entries", "facts"):
        if bad_entries.intersection(entries or []):
            bad_summaries.add(sid)
        for aid, fact in (facts or {}).items():
            if aid in changed:
                bad_summaries.add(sid)
                seqs = fact.get("seqs") or []
                bad_entries.update(TimelineEntry.objects.filter(owner_id=owner_id, seq__in=seqs).values_list("id", flat=True))
    s = summaries.filter(id__in=bad_summaries).update(invalidated_at=now, invalidated_reason=reason)
    t = topics.filter(source_entry_id__in=bad_entries).update(invalidated_at=now, invalidated_reason=reason) if bad_entries else 0
    log_event("companion_progress_invalidated", owner=owner_id, epoch=epoch, reason=reason, summaries=s, topics=t)


# --- the next call's continuity --------------------------------------------------------------


def continuity_for(
    owner_id: int, *, now: datetime | None = None, enabled: bool | None = None, facts: bool = True
) -> dict[str, Any]:
    """What the next call of ``owner_id`` may continue from, for the snapshot's background.

    The three texts call start reads: ``latest_summary`` (the newest valid summary, then the
    details already told and what finished; "" when no summary is ready), ``resume_thread``
    (the label of one theme the owner talked about and did not finish, refuse or tire of;
    "" when none) and ``avoid_topics`` (labels of refused topics: never raised until the
    owner brings them up). Beside them, with their
    sources: ``resume`` (the thread as {topic_key, label, quote, last_question,
    source_entry, source_call}), ``known_details`` (details already told — the newest
    statement of each — never asked again), ``finished`` (stories and activities done:
    never resumed), ``cooling`` (short replies lately: not pushed now) and ``facts`` (the
    L3 assertions the recent calls produced, each once by assertion id, from its *current*
    version: an owner's edit wins, forgotten ones are gone). Empty when the owner turned
    continuity off. Every query is by owner: another owner's rows are never read.

    Call start passes what it already read under the owner's privacy epoch lock:
    ``enabled`` (the continuity switch; None: read it here) and ``facts=False`` (its
    background quotes no facts, so the facts query is skipped and ``facts`` stays empty).
    """
    owner_id = int(getattr(owner_id, "pk", owner_id))
    now = now or timezone.now()
    out: dict[str, Any] = {"latest_summary": "", "resume_thread": "", "avoid_topics": [], "resume": None,
                           "known_details": [], "finished": [], "cooling": [], "facts": []}
    if not (privacy_epoch.continuity_enabled(owner_id) if enabled is None else enabled):
        return out
    if statements.on_postgresql():  # built once per process: companion.queries.recent_summaries_sql
        sql, fields = queries.recent_summaries_sql(SUMMARIES_READ)
        found: Any = statements.fetch(sql, [owner_id], fields)
    else:  # SQLite takes the ORM
        found = CallSummary.objects.filter(owner_id=owner_id, invalidated_at__isnull=True).order_by("-created_at", "-id").values_list(
            "text", "facts")[:SUMMARIES_READ]
    recent = [{"text": text, "facts": facts} for text, facts in found]
    ordered = sorted(current_states(owner_id).values(), key=lambda r: (r.created_at, r.position, r.id), reverse=True)
    for row in ordered:
        if row.state == TopicState.State.REFUSED:
            out["avoid_topics"].append(row.label)
        elif row.state == TopicState.State.DONE:
            out["finished"].append(row.label)
        elif row.state == TopicState.State.COOLDOWN and row.cooldown_until and row.cooldown_until > now:
            out["cooling"].append(row.label)
        elif row.state == TopicState.State.ANSWERED and is_detail(row.topic_key):
            out["known_details"].append({"topic_key": row.topic_key, "label": row.label, "quote": row.quote,
                                         "source_entry": row.source_entry_id, "source_call": row.source_call_id})
        elif row.state == TopicState.State.ANSWERED and out["resume"] is None:
            out["resume"] = {"topic_key": row.topic_key, "label": row.label, "quote": row.quote,
                             "last_question": row.last_question or None, "source_entry": row.source_entry_id,
                             "source_call": row.source_call_id}
            out["resume_thread"] = row.label
    out["latest_summary"] = _summary_text(recent[0]["text"] if recent else "", out)
    out["facts"] = _current_facts(owner_id, recent) if facts else []
    return out


def _summary_text(latest: str, out: dict[str, Any]) -> str:
    """The newest summary, then what progress says beyond it: the details already told
    (their newest statement: never asked again) and what finished (never resumed)."""
    parts = [latest[:SUMMARY_IN_TEXT]] if latest else []
    if out["known_details"]:
        parts.append("已经说过（不要再问）：" + "；".join(f"{d['label']}「{d['quote'][:40]}」" for d in out["known_details"][:3]))
    if out["finished"]:
        parts.append("已经讲完（不要当作没讲完）：" + "、".join(out["finished"][:3]))
    return "。".join(parts)


def _current_facts(owner_id: int, recent: list[Any]) -> list[dict[str, Any]]:
    """The assertions the recent summaries cite, each once (by id, newest summary first),
    with the payload of its *current* version; forgotten ones are left out. One query."""
    seen: list[str] = []
    for summary in recent:
        for aid in summary["facts"] or {}:
            if aid not in seen:
                seen.append(aid)
    if not seen:
        return []
    current = {
        str(aid): (version, predicate, payload)
        for aid, version, predicate, payload in AssertionVersion.objects.filter(
            assertion__owner_id=owner_id, assertion_id__in=seen[: FACTS_MAX * 2], assertion__state=Assertion.State.ACTIVE,
            version=F("assertion__current_version"), erased=False,
        ).values_list("assertion_id", "version", "assertion__predicate", "payload")
    }
    facts = []
    for aid in seen:
        if aid not in current:
            continue
        version, predicate, payload = current[aid]
        facts.append({"assertion_id": aid, "version": version, "predicate": predicate, "text": payload_text(payload)[:FACT_CHARS]})
        if len(facts) == FACTS_MAX:
            break
    return facts
