"""L3 assertions: the only code that writes ``Assertion``, ``AssertionVersion``,
``AssertionDependency`` and ``MemoryReceipt`` (flow F7 of docs/architecture.md), but the
receipts of a timeline erasure, which ``memory.timeline.erasure`` stores in its own
transaction (kind ``erase``).

- ``commit``: a new version, compare-and-set on the version the writer believes current,
  in one transaction under the owner's memory lock (``memory.locks``). A request id seen
  before returns the stored result. Every current assertion downstream of the changed
  one is marked ``needs_reevaluation`` (the mark never negates a conclusion).
- ``forget``: a recursive query over every historical dependency finds what is affected;
  the payloads and evidence of all their versions are erased, a tombstone stays, and a
  later commit to any of them is refused with ``forgotten``. Copies of those payloads that
  other apps keep (the gateway's ledger, consent cards, sub-agent tasks) are redacted by
  those apps' own services (``memory.copies``). The result says exactly what was erased,
  which copies were redacted, and what was not (L4, L5 and backups are never claimed).
- ``query`` / ``history`` / ``forget_preview``: reads.

The two graph walks are recursive CTEs that PostgreSQL and SQLite both run (SQLite has
``WITH RECURSIVE`` since 3.8.3; ``memory.queries``); ``UNION`` (not ``UNION ALL``) makes them
stop on cycles.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from memory import copies, queries, source_changes
from memory.assertions import speaking_rules
from memory.assertions.models import Assertion, AssertionDependency, AssertionVersion, MemoryReceipt, MemorySession
from memory.assertions.predicates import CORE_DOCS, CORE_PROFILE, PROJECTED_PREDICATES, SPEAKING_PREFERENCES
from memory.assertions.projections import regenerate as regenerate_projections
from memory.locks import lock_owner_memory
from memory.timeline.models import TimelineEntry
from yimi_project.errors import YimiError
from yimi_project.infra import statements
from yimi_project.logs import log_event

ACTORS = ("owner", "agent", "operator", "import")

PREDICATE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,64}$")
MAX_PREDICATE = 64
MAX_PAYLOAD_BYTES = 16 * 1024
MAX_CORE_ENTRY_CHARS = 2000
MAX_EVIDENCE = 100
MAX_DEPENDENCIES = 50
SUMMARY_CHARS = 500
CHUNK = 500

# What a forget never erases; said in every forget result.
NOT_ERASED = (
    "L4 timeline entries (including those cited as evidence)",
    "L5 raw originals (audio, images, events)",
    "backups",
    "one-way digests of calls and cards (fingerprints), which hold no text",
    "the rows' old versions, still bytes in the database's files and log until the operator runs manage.py forget_compact",
)


def canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def _digest(data: Any) -> str:
    return hashlib.sha256(canonical(data).encode("utf-8")).hexdigest()


def parse_uuid(value: Any, what: str = "assertion_id") -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except (ValueError, TypeError, AttributeError):
        raise YimiError("not_found", f"there is no such assertion ({what})") from None


def payload_text(payload: Any) -> str:
    """One line of text for a payload: its ``text`` if it has one, else compact JSON."""
    if isinstance(payload, dict) and isinstance(payload.get("text"), str):
        text = payload["text"]
    elif isinstance(payload, str):
        text = payload
    else:
        text = canonical(payload)
    return " ".join(text.split())


# --- input ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dependency:
    assertion_id: uuid.UUID
    version: int


@dataclass(frozen=True)
class CommitRequest:
    """One commit as the writer asked for it. ``assertion_id`` None (or an unknown id) with
    ``expected_version`` 0 creates a new assertion."""

    owner_id: int
    request_id: str
    predicate: str
    payload: Any
    expected_version: int
    assertion_id: uuid.UUID | None = None
    evidence: tuple[int, ...] = ()
    depends_on: tuple[Dependency, ...] = ()
    actor: str = "owner"

    @classmethod
    def from_payload(cls, owner_id: int, data: Any, *, actor: str) -> CommitRequest:
        """Parse an API body; bad input raises ``invalid_request`` and changes nothing."""
        if not isinstance(data, dict):
            raise YimiError("invalid_request", "expected a JSON object")
        raw_id = data.get("assertion_id")
        assertion_id = None if raw_id in (None, "") else _uuid_or_invalid(raw_id, "assertion_id")
        deps = data.get("depends_on") or []
        if not isinstance(deps, list):
            raise YimiError("invalid_request", "depends_on must be a list of {assertion_id, version}")
        parsed = []
        for dep in deps:
            if not isinstance(dep, dict):
                raise YimiError("invalid_request", "depends_on must be a list of {assertion_id, version}")
            parsed.append(Dependency(_uuid_or_invalid(dep.get("assertion_id"), "depends_on.assertion_id"), _int(dep.get("version"), "depends_on.version")))
        evidence = data.get("evidence") or []
        if not isinstance(evidence, list):
            raise YimiError("invalid_request", "evidence must be a list of timeline sequence numbers")
        return cls(
            owner_id=owner_id,
            request_id=_text(data.get("request_id")),
            predicate=_text(data.get("predicate")),
            payload=data.get("payload"),
            expected_version=_int(data.get("expected_version"), "expected_version"),
            assertion_id=assertion_id,
            evidence=tuple(_int(e, "evidence") for e in evidence),
            depends_on=tuple(parsed),
            actor=actor,
        )

    def fingerprint(self) -> str:
        body = asdict(self)
        body.pop("actor")
        return _digest(body)

    def validate(self) -> None:
        if not REQUEST_ID.match(self.request_id or ""):
            raise YimiError("invalid_request", "request_id must be 1-64 characters of letters, digits and ._:@-")
        if not PREDICATE.match(self.predicate) or len(self.predicate) > MAX_PREDICATE:
            raise YimiError("invalid_request", "predicate must look like 'preference.food' (lower case, dots, ≤64 characters)")
        if self.actor not in ACTORS:
            raise YimiError("invalid_request", f"actor must be one of {', '.join(ACTORS)}")
        if self.expected_version < 0:
            raise YimiError("invalid_request", "expected_version must be 0 (new) or the current version")
        if self.payload is None:
            raise YimiError("invalid_request", "payload is required")
        if len(canonical(self.payload).encode("utf-8")) > MAX_PAYLOAD_BYTES:
            raise YimiError("invalid_request", f"payload is at most {MAX_PAYLOAD_BYTES} bytes of JSON")
        if len(self.evidence) > MAX_EVIDENCE or len(self.depends_on) > MAX_DEPENDENCIES:
            raise YimiError("invalid_request", f"at most {MAX_EVIDENCE} evidence entries and {MAX_DEPENDENCIES} dependencies")
        if len({d.assertion_id for d in self.depends_on}) != len(self.depends_on):
            raise YimiError("invalid_request", "each assertion appears at most once in depends_on")
        if self.assertion_id is not None and any(d.assertion_id == self.assertion_id for d in self.depends_on):
            raise YimiError("invalid_request", "an assertion cannot depend on itself")
        _validate_predicate_payload(self.predicate, self.payload)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _uuid_or_invalid(value: Any, name: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except (ValueError, TypeError, AttributeError):
        raise YimiError("invalid_request", f"{name} must be a UUID") from None


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise YimiError("invalid_request", f"{name} must be an integer")
    return value


def _validate_predicate_payload(predicate: str, payload: Any) -> None:
    """The shapes the projections rely on, and the speaking-preference rules."""
    if predicate == CORE_PROFILE:
        if not isinstance(payload, dict) or not isinstance(payload.get("text"), str) or not payload["text"].strip():
            raise YimiError("invalid_request", "a core_profile.entry payload is {\"text\": ..., \"doc\": \"user\"|\"memory\"}")
        if len(payload["text"]) > MAX_CORE_ENTRY_CHARS:
            raise YimiError("invalid_request", f"a core profile entry is at most {MAX_CORE_ENTRY_CHARS} characters")
        if payload.get("doc", "memory") not in CORE_DOCS:
            raise YimiError("invalid_request", "doc must be 'user' (USER.md) or 'memory' (MEMORY.md)")
    elif predicate == SPEAKING_PREFERENCES:
        if not isinstance(payload, dict) or set(payload) != {"text"}:
            raise YimiError("invalid_request", "a speaking.preferences payload is {\"text\": ...}")
        problem = speaking_rules.problem(payload["text"])
        if problem is not None:
            code, message, details = problem
            raise YimiError(code, message, **details)


# --- results ----------------------------------------------------------------------------------


@dataclass
class CommitResult:
    assertion_id: str
    version: int
    predicate: str
    request_id: str
    committed_at: str
    marked_for_reevaluation: list[str] = field(default_factory=list)
    replayed: bool = False

    def payload(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ForgetResult:
    target: str
    request_id: str
    forgotten: list[dict[str, Any]]
    versions_erased: int
    already_forgotten: bool
    forgotten_at: str
    redacted: dict[str, int] = field(default_factory=dict)  # "app.place" → rows holding a copy, redacted
    replayed: bool = False

    def payload(self) -> dict[str, Any]:
        body = asdict(self)
        body.update(
            assertions_forgotten=len(self.forgotten),
            erased=(
                "the payload and evidence of every version of the L3 assertions listed in 'forgotten'; "
                "copies of those payloads elsewhere on the platform (tool call ledger, consent cards, "
                "sub-agent tasks) are redacted, counted per place in 'redacted'"
            ),
            kept="a tombstone per assertion: its id, predicate, version numbers and when it was forgotten",
            not_erased=list(NOT_ERASED),
        )
        return body

    @classmethod
    def from_stored(cls, data: dict[str, Any]) -> ForgetResult:
        keys = ("target", "request_id", "forgotten", "versions_erased", "already_forgotten", "forgotten_at")
        return cls(**{k: data[k] for k in keys}, redacted=dict(data.get("redacted") or {}))


def _replay(owner_id: int, request_id: str, fingerprint: str) -> dict[str, Any] | None:
    stored = MemoryReceipt.objects.filter(owner_id=owner_id, request_id=request_id).first()
    if stored is None:
        return None
    if stored.fingerprint != fingerprint:
        raise YimiError("request_id_reused", "this request id was already used for a different request")
    return stored.result


# --- commit -----------------------------------------------------------------------------------


def commit(request: CommitRequest) -> CommitResult:
    """Commit a new version of an assertion, compare-and-set on ``expected_version``.

    Steps: 0. validate the input (bad input changes nothing); then in one transaction:
    1. take the owner's memory lock (``pg_advisory_xact_lock`` on PostgreSQL; SQLite's
    ``BEGIN IMMEDIATE`` already holds the write lock); 2. a request id seen before returns
    the stored result (``replayed``), or ``request_id_reused`` if the body differs;
    3. find the assertion: unknown with expected 0 → created; another owner's or unknown
    with expected > 0 → ``not_found``; forgotten → ``forgotten``; current ≠ expected →
    ``conflict`` (nothing changes); a different predicate → ``invalid_request``;
    4. check evidence (the owner's timeline entries) and dependencies (the owner's, not
    forgotten, version 1..current; one on an older version is accepted and marks the new
    version for re-evaluation at once); 5. insert the version and its dependencies, then
    ``UPDATE ... SET current_version = e + 1 WHERE current_version = e`` (a row count other
    than 1 is a lost race: ``conflict``, all rolled back); 6. mark every current assertion
    downstream ``needs_reevaluation``; 7. store the receipt. After commit the projections
    fed by the predicate are regenerated.
    """
    request.validate()
    fingerprint = request.fingerprint()
    with transaction.atomic():
        lock_owner_memory(request.owner_id)
        stored = _replay(request.owner_id, request.request_id, fingerprint)
        if stored is not None:
            return CommitResult(**{**stored, "replayed": True})
        now = timezone.now()
        assertion, created = _target_for_commit(request, now)
        stale_deps = _check_sources(request)
        new_version = request.expected_version + 1
        AssertionVersion.objects.create(
            assertion=assertion, version=new_version, payload=request.payload, evidence=list(request.evidence),
            actor=request.actor, request_id=request.request_id, committed_at=now,
        )
        AssertionDependency.objects.bulk_create(
            [
                AssertionDependency(downstream=assertion, downstream_version=new_version, upstream_id=d.assertion_id, upstream_version=d.version)
                for d in request.depends_on
            ]
        )
        own_mark = {"needs_reevaluation": False, "reevaluation_reason": "", "marked_at": None}
        if stale_deps:
            own_mark = {
                "needs_reevaluation": True,
                "reevaluation_reason": f"concluded from an older version of {', '.join(stale_deps)}"[:300],
                "marked_at": now,
            }
        swapped = Assertion.objects.filter(
            id=assertion.id, owner_id=request.owner_id, state=Assertion.State.ACTIVE, current_version=request.expected_version
        ).update(current_version=new_version, summary=payload_text(request.payload)[:SUMMARY_CHARS], updated_at=now, **own_mark)
        if swapped != 1:
            raise YimiError("conflict", "the assertion changed while committing; read it again")
        marked = mark_downstream(assertion.id, reason=f"{request.predicate} {str(assertion.id)[:8]} changed to version {new_version}", now=now) if not created else []
        if not created and request.predicate != SPEAKING_PREFERENCES:  # an edit of a fact: what was derived from it is invalid (memory.source_changes)
            source_changes.notify(source_changes.SourceChange(request.owner_id, source_changes.EDITED, (str(assertion.id),)))
        result = CommitResult(
            assertion_id=str(assertion.id), version=new_version, predicate=request.predicate, request_id=request.request_id,
            committed_at=now.isoformat(), marked_for_reevaluation=[str(m) for m in marked],
        )
        stored_result = result.payload()
        stored_result.pop("replayed")
        MemoryReceipt.objects.create(
            owner_id=request.owner_id, request_id=request.request_id, kind="commit", fingerprint=fingerprint, result=stored_result
        )
        if request.predicate in PROJECTED_PREDICATES:
            transaction.on_commit(partial(_regenerate_projections, request.owner_id))
    log_event(
        "assertion_committed", assertion_id=result.assertion_id, version=new_version, predicate=request.predicate,
        actor=request.actor, marked=len(marked),
    )
    return result


def _target_for_commit(request: CommitRequest, now: Any) -> tuple[Assertion, bool]:
    """Step 3 of ``commit``: the assertion to write, created if new. Raises the refusals."""
    assertion = None
    if request.assertion_id is not None:
        assertion = Assertion.objects.filter(id=request.assertion_id).first()
        if assertion is not None and assertion.owner_id != request.owner_id:
            raise YimiError("not_found", "there is no such assertion")
    if assertion is None:
        if request.expected_version != 0:
            raise YimiError("not_found", "there is no such assertion; use expected_version 0 to create one")
        if request.predicate == SPEAKING_PREFERENCES:
            current = Assertion.objects.filter(
                owner_id=request.owner_id, predicate=SPEAKING_PREFERENCES, state=Assertion.State.ACTIVE
            ).first()
            if current is not None:
                raise YimiError(
                    "conflict", "the owner already has speaking preferences; commit a new version of them",
                    assertion_id=str(current.id), current_version=current.current_version,
                )
        try:
            with transaction.atomic():
                assertion = Assertion.objects.create(
                    id=request.assertion_id or uuid.uuid4(), owner_id=request.owner_id, predicate=request.predicate,
                    current_version=0, updated_at=now,
                )
        except IntegrityError:
            raise YimiError("conflict", "this assertion id is taken; read it again") from None
        return assertion, True
    if assertion.state == Assertion.State.FORGOTTEN:
        raise YimiError("forgotten", "this assertion was forgotten; it cannot be committed again")
    if assertion.current_version != request.expected_version:
        raise YimiError(
            "conflict",
            f"the assertion is at version {assertion.current_version}, not {request.expected_version}; read it again and decide",
            current_version=assertion.current_version,
        )
    if assertion.predicate != request.predicate:
        raise YimiError("invalid_request", f"this assertion's predicate is {assertion.predicate}; it cannot change")
    return assertion, False


def _check_sources(request: CommitRequest) -> list[str]:
    """Step 4 of ``commit``: evidence and dependencies. Returns the dependencies that are
    on an older version than their upstream's current one."""
    if request.evidence:
        wanted = set(request.evidence)
        found = set(TimelineEntry.objects.filter(owner_id=request.owner_id, seq__in=wanted).values_list("seq", flat=True))
        if wanted - found:
            raise YimiError("invalid_request", f"evidence names timeline entries that do not exist: {sorted(wanted - found)[:10]}")
    stale: list[str] = []
    if request.depends_on:
        upstreams = {
            a.id: a
            for a in Assertion.objects.filter(id__in=[d.assertion_id for d in request.depends_on], owner_id=request.owner_id)
        }
        for dep in request.depends_on:
            upstream = upstreams.get(dep.assertion_id)
            if upstream is None:
                raise YimiError("invalid_request", f"depends_on names an assertion that does not exist: {dep.assertion_id}")
            if upstream.state == Assertion.State.FORGOTTEN:
                raise YimiError("forgotten", f"depends_on names a forgotten assertion: {dep.assertion_id}")
            if not 1 <= dep.version <= upstream.current_version:
                raise YimiError("invalid_request", f"{dep.assertion_id} has no version {dep.version}")
            if dep.version < upstream.current_version:
                stale.append(str(dep.assertion_id)[:8])
    return stale


def _regenerate_projections(owner_id: int) -> None:
    try:
        regenerate_projections(owner_id)
    except Exception as exc:
        log_event("projection_regeneration_failed", error=type(exc).__name__)


# --- the dependency graph ---------------------------------------------------------------------


def _db_id(value: uuid.UUID) -> Any:
    return Assertion._meta.pk.get_db_prep_value(value, connection)  # type: ignore[union-attr]


def _walk(sql: str, start: uuid.UUID) -> set[uuid.UUID]:
    # Planned with its start each time: a generic plan of the recursive walk made the forget
    # preview of a 10,000-assertion graph 2.5 times slower (bench/memory.py, issue 14).
    with statements.custom_plans(), connection.cursor() as cursor:
        cursor.execute(sql, [_db_id(start)])
        return {uuid.UUID(str(row[0])) for row in cursor.fetchall()}


def downstream_current(assertion_id: uuid.UUID) -> set[uuid.UUID]:
    """Active assertions whose *current* version depends, directly or through other current
    versions, on ``assertion_id`` (the start itself excluded): ``memory.queries.downstream_current_sql``."""
    return _walk(queries.downstream_current_sql(), assertion_id) - {assertion_id}


def affected_by_forgetting(assertion_id: uuid.UUID) -> set[uuid.UUID]:
    """The assertion and everything that ever depended on it, through any version of any
    assertion in between (historical dependencies): ``memory.queries.affected_by_forgetting_sql``."""
    return _walk(queries.affected_by_forgetting_sql(), assertion_id)


def mark_downstream(assertion_id: uuid.UUID, *, reason: str, now: Any) -> list[uuid.UUID]:
    """Mark every current downstream assertion ``needs_reevaluation`` (its payload and
    version are untouched: the mark never negates a conclusion)."""
    ids = sorted(downstream_current(assertion_id), key=str)
    for chunk in _chunks(ids):
        Assertion.objects.filter(id__in=chunk, state=Assertion.State.ACTIVE).update(
            needs_reevaluation=True, reevaluation_reason=reason[:300], marked_at=now
        )
    return ids


def _chunks(items: list[Any], size: int = CHUNK) -> Iterable[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


# --- forget -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForgetPreview:
    target: Assertion
    affected: list[Assertion]  # target first, then by predicate

    def payload(self) -> dict[str, Any]:
        return {
            "target": str(self.target.id),
            "will_forget": [
                {"id": str(a.id), "predicate": a.predicate, "versions": a.current_version, "state": a.state, "summary": a.summary}
                for a in self.affected
            ],
            "not_erased": list(NOT_ERASED),
        }


def forget_preview(owner_id: int, assertion_id: Any) -> ForgetPreview:
    """Everything ``forget`` would forget, without changing anything."""
    with statements.custom_plans():  # rare, over graphs of any size: planned with its own values
        return _forget_preview(owner_id, assertion_id)


def _forget_preview(owner_id: int, assertion_id: Any) -> ForgetPreview:
    target = _owned(owner_id, assertion_id)
    ids = affected_by_forgetting(target.id)
    rows = {a.id: a for a in _in_chunks(Assertion.objects.filter(owner_id=owner_id), ids)}
    others = sorted((rows[i] for i in ids if i != target.id and i in rows), key=lambda a: (a.predicate, str(a.id)))
    return ForgetPreview(target, [target, *others])


def forget(owner_id: int, assertion_id: Any, *, request_id: str, actor: str = "owner") -> ForgetResult:
    """Forget an assertion and everything concluded from it, for good.

    Steps, in one transaction under the owner's memory lock: 1. a request id seen before
    returns the stored result; 2. the target must be the owner's (``not_found``);
    3. the recursive query collects the target and every assertion that depended on it
    through any historical version; 4. erase the payload and evidence of all their
    versions (``UPDATE ... WHERE erased = false``) and turn them into tombstones
    (``state = forgotten``), keeping the erased payloads in hand; 5. check that no payload
    of theirs is left — if one is, raise ``forget_incomplete`` and roll everything back;
    6. reset every memory session that was told any of them (its stored prompt blocks hold
    copies); 7. every app that keeps copies redacts them through its own service
    (``memory.copies.redact_copies``: the ledger's arguments and results, card previews,
    sub-agent tasks), and the counts per place go in the result — a redactor that fails
    rolls the whole forget back; 8. store the receipt. After commit the projections are
    regenerated. An already forgotten target is a success with nothing more erased.
    """
    with statements.custom_plans():  # rare, over graphs of any size: planned with its own values
        return _forget(owner_id, assertion_id, request_id=request_id, actor=actor)


def _forget(owner_id: int, assertion_id: Any, *, request_id: str, actor: str) -> ForgetResult:
    if not REQUEST_ID.match(request_id or ""):
        raise YimiError("invalid_request", "request_id must be 1-64 characters of letters, digits and ._:@-")
    target_id = parse_uuid(assertion_id)
    fingerprint = _digest({"forget": str(target_id)})
    with transaction.atomic():
        lock_owner_memory(owner_id)
        stored = _replay(owner_id, request_id, fingerprint)
        if stored is not None:
            result = ForgetResult.from_stored(stored)
            result.replayed = True
            return result
        target = _owned(owner_id, target_id)
        now = timezone.now()
        already = target.state == Assertion.State.FORGOTTEN
        ids = sorted(affected_by_forgetting(target.id), key=str)
        rows = {a.id: a for a in _in_chunks(Assertion.objects.filter(owner_id=owner_id), ids)}
        erased_per: dict[uuid.UUID, int] = {}
        payloads: list[Any] = []
        for chunk in _chunks(ids):
            for aid, count in _count_unerased(chunk).items():
                erased_per[aid] = count
            payloads.extend(
                AssertionVersion.objects.filter(assertion_id__in=chunk, erased=False, payload__isnull=False).values_list("payload", flat=True)
            )
            AssertionVersion.objects.filter(assertion_id__in=chunk, erased=False).update(payload=None, evidence=[], erased=True)
            Assertion.objects.filter(id__in=chunk, state=Assertion.State.ACTIVE).update(
                state=Assertion.State.FORGOTTEN, summary="", needs_reevaluation=False, reevaluation_reason="", marked_at=None,
                forgotten_at=now, forgotten_by=request_id, updated_at=now,
            )
        left = sum(
            AssertionVersion.objects.filter(assertion_id__in=chunk).filter(Q(erased=False) | Q(payload__isnull=False)).count()
            for chunk in _chunks(ids)
        )
        if left:
            raise YimiError("forget_incomplete", f"{left} versions still hold a payload; nothing was forgotten")
        forgotten = [
            {
                "id": str(aid),
                "predicate": rows[aid].predicate,
                "versions_erased": erased_per.get(aid, 0),
                "role": "target" if aid == target.id else "dependent",
            }
            for aid in sorted(ids, key=lambda i: (i != target.id, rows[i].predicate, str(i)))
            if aid in rows and erased_per.get(aid, 0) > 0
        ]
        _reset_sessions_told(owner_id, {str(i) for i in ids})
        redacted = copies.redact_copies(owner_id, copies.ForgottenContent(payloads))
        if forgotten:  # what was derived from them is invalid (memory.source_changes)
            source_changes.notify(source_changes.SourceChange(owner_id, source_changes.FORGOTTEN, tuple(f["id"] for f in forgotten)))
        result = ForgetResult(
            target=str(target.id), request_id=request_id, forgotten=forgotten,
            versions_erased=sum(f["versions_erased"] for f in forgotten), already_forgotten=already, forgotten_at=now.isoformat(),
            redacted=redacted,
        )
        stored_result = asdict(result)
        stored_result.pop("replayed")
        MemoryReceipt.objects.create(owner_id=owner_id, request_id=request_id, kind="forget", fingerprint=fingerprint, result=stored_result)
        if any(rows[i].predicate in PROJECTED_PREDICATES for i in ids if i in rows):
            transaction.on_commit(partial(_regenerate_projections, owner_id))
    log_event(
        "assertions_forgotten", target=str(target.id), assertions=len(forgotten), versions=result.versions_erased, actor=actor,
        copies_redacted=sum(redacted.values()),
    )
    return result


def _count_unerased(ids: list[uuid.UUID]) -> dict[uuid.UUID, int]:
    from django.db.models import Count

    rows = AssertionVersion.objects.filter(assertion_id__in=ids, erased=False).values("assertion_id").annotate(n=Count("id"))
    return {r["assertion_id"]: r["n"] for r in rows}


def _reset_sessions_told(owner_id: int, ids: set[str]) -> None:
    """Step 6 of ``forget``: a session whose baseline names a forgotten assertion drops its
    stored blocks and baseline (revision + 1, so a plan made before cannot be accepted)."""
    for session in MemorySession.objects.filter(owner_id=owner_id).only("id", "baseline"):
        if ids & set(session.baseline or {}):
            MemorySession.objects.filter(id=session.id).update(
                baseline={}, blocks=[], scope="", revision=F("revision") + 1, generation=F("generation") + 1,
                reset_reason="fact_forgotten", updated_at=timezone.now(),
            )


def _owned(owner_id: int, assertion_id: Any) -> Assertion:
    aid = assertion_id if isinstance(assertion_id, uuid.UUID) else parse_uuid(assertion_id)
    assertion = Assertion.objects.filter(id=aid, owner_id=owner_id).first()
    if assertion is None:
        raise YimiError("not_found", "there is no such assertion")
    return assertion


def _in_chunks(qs: Any, ids: Iterable[uuid.UUID]) -> list[Any]:
    out: list[Any] = []
    for chunk in _chunks(list(ids)):
        out.extend(qs.filter(id__in=chunk))
    return out


# --- reads ------------------------------------------------------------------------------------


def query(
    owner_id: int,
    *,
    predicate: str | None = None,
    prefix: str | None = None,
    text: str | None = None,
    needs_reevaluation: bool | None = None,
    include_forgotten: bool = False,
    exclude_predicates: Iterable[str] = (),
    limit: int = 50,
) -> list[dict[str, Any]]:
    """Current assertions (newest change first) with their current payload."""
    qs = Assertion.objects.filter(owner_id=owner_id, current_version__gt=0)
    if not include_forgotten:
        qs = qs.filter(state=Assertion.State.ACTIVE)
    if predicate:
        qs = qs.filter(predicate=predicate)
    if prefix:
        qs = qs.filter(predicate__startswith=prefix)
    if text:
        qs = qs.filter(summary__icontains=text)
    if needs_reevaluation is not None:
        qs = qs.filter(needs_reevaluation=needs_reevaluation)
    excluded = list(exclude_predicates)
    if excluded:
        qs = qs.exclude(predicate__in=excluded)
    rows = list(qs.order_by("-updated_at", "id")[: max(1, min(limit, 500))])
    return serialize_current(rows)


def serialize_current(rows: list[Assertion]) -> list[dict[str, Any]]:
    versions = {
        v.assertion_id: v
        for v in AssertionVersion.objects.filter(assertion_id__in=[a.id for a in rows], version=F("assertion__current_version"))
    }
    deps: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for d in AssertionDependency.objects.filter(downstream_id__in=[a.id for a in rows], downstream_version=F("downstream__current_version")):
        deps.setdefault(d.downstream_id, []).append({"assertion_id": str(d.upstream_id), "version": d.upstream_version})
    return [_serialize(a, versions.get(a.id), deps.get(a.id, [])) for a in rows]


def _serialize(a: Assertion, current: AssertionVersion | None, deps: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": str(a.id),
        "predicate": a.predicate,
        "version": a.current_version,
        "state": a.state,
        "payload": current.payload if current is not None else None,
        "evidence": current.evidence if current is not None else [],
        "depends_on": deps,
        "needs_reevaluation": a.needs_reevaluation,
        "reevaluation_reason": a.reevaluation_reason or None,
        "updated_at": a.updated_at.isoformat(),
        "forgotten_at": a.forgotten_at.isoformat() if a.forgotten_at else None,
    }


def get(owner_id: int, assertion_id: Any) -> dict[str, Any]:
    return serialize_current([_owned(owner_id, assertion_id)])[0]


def history(owner_id: int, assertion_id: Any) -> dict[str, Any]:
    """The assertion with every version (oldest first), each with its dependencies, and
    the assertions that depend on it now."""
    assertion = _owned(owner_id, assertion_id)
    deps: dict[int, list[dict[str, Any]]] = {}
    for d in AssertionDependency.objects.filter(downstream=assertion).order_by("upstream_id"):
        deps.setdefault(d.downstream_version, []).append({"assertion_id": str(d.upstream_id), "version": d.upstream_version})
    versions = [
        {
            "version": v.version,
            "payload": v.payload,
            "evidence": v.evidence,
            "erased": v.erased,
            "depends_on": deps.get(v.version, []),
            "actor": v.actor,
            "request_id": v.request_id,
            "committed_at": v.committed_at.isoformat(),
        }
        for v in assertion.versions.order_by("version")
    ]
    dependents = sorted(
        {
            (str(d.downstream_id), d.downstream_version, d.upstream_version)
            for d in AssertionDependency.objects.filter(upstream=assertion, downstream_version=F("downstream__current_version"))
        }
    )
    header = serialize_current([assertion])[0]
    header.pop("payload")
    return {
        "assertion": header,
        "versions": versions,
        "dependents": [{"assertion_id": a, "version": v, "on_version": u} for a, v, u in dependents],
    }
