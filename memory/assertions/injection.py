"""Incremental memory injection into a brain session (flow F7 of docs/architecture.md).

A ``MemorySession`` (one per owner and key; the runner uses ``"main"``, the owner's one
conversation) records what the brain has been told from L3: a ``baseline`` (assertion id
→ version token) and the memory ``blocks`` already sent, each anchored at the timeline
seq of the turn that carried it.

Per run:

1. ``plan`` compares the facts the run's scope may see with the baseline:
   - same scope, nothing edited or gone → **incremental**: the earlier blocks are replayed
     unchanged at their anchors and only facts new since the baseline form the new block
     (none new: no new block);
   - a fact edited (new version or a re-evaluation mark), deleted/forgotten, or the scope
     changed → **rebuild**: the old blocks are dropped and one block with the current
     facts starts a new generation (the reason is kept in ``reset_reason`` and logged as
     ``memory_session_reset``);
2. the run builds its prompt with the plan (``brain.prompts.with_memory``);
3. ``accept`` advances the baseline only after the brain accepted the prompt, by
   compare-and-set on the session's ``revision``: a run that failed before that leaves
   the baseline where it was (the same facts are offered again next time), and a plan
   made before a concurrent change (another run, a forget) cannot overwrite it.

Only the ``owner`` scope sees facts; any other scope sees none (a rebuild to an empty
session, so the owner's session is rebuilt when the owner speaks again). Core profile
entries and speaking preferences are not facts here: every run gets them whole from the
projections. A rebuild lists at most ``MAX_FACTS`` facts (newest first) and says how
many more exist; the baseline still holds them all.

The only code that writes ``MemorySession``, but one step of forgetting:
``memory.assertions.store.forget`` resets the sessions that were told a forgotten fact
(their blocks and baseline dropped, revision + 1), in the forget's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from django.db.models import F
from django.utils import timezone

from memory import queries
from memory.assertions import store as assertions
from memory.assertions.models import Assertion, MemorySession
from yimi_project.infra import statements
from yimi_project.logs import log_event

SCOPES_WITH_FACTS = ("owner",)
MAX_FACTS = 100
MAX_BLOCKS = 40  # more blocks than this: rebuild into one ("compacted")
DEFAULT_KEY = "main"


@dataclass(frozen=True)
class Block:
    anchor: int
    text: str

    def as_dict(self) -> dict[str, Any]:
        return {"anchor": self.anchor, "text": self.text}


@dataclass
class InjectionPlan:
    session_id: int
    revision: int
    scope: str
    mode: str  # "incremental" | "rebuild"
    reason: str  # why a rebuild: new_session, fact_edited, fact_deleted, fact_forgotten, scope_changed, compacted ("" if none)
    earlier: list[Block]
    new_block: Block | None
    next_baseline: dict[str, str]
    new_facts: list[str] = field(default_factory=list)  # assertion ids in the new block

    @property
    def blocks(self) -> list[Block]:
        return [*self.earlier, *([self.new_block] if self.new_block else [])]


def _token(a: Assertion) -> str:
    return f"{a.current_version}{'!' if a.needs_reevaluation else ''}"


def visible_facts(owner_id: int, scope: str) -> list[Assertion]:
    """The owner's current facts the scope may see, newest first (on every owner run: on
    PostgreSQL the SELECT built once per process, ``memory.queries.visible_facts_sql``;
    SQLite takes the ORM)."""
    if scope not in SCOPES_WITH_FACTS:
        return []
    if statements.on_postgresql():
        sql, fields = queries.visible_facts_sql()
        return statements.fetch_instances(Assertion, sql, [owner_id, Assertion.State.ACTIVE, 0, *assertions.PROJECTED_PREDICATES], fields)
    return list(
        Assertion.objects.filter(owner_id=owner_id, state=Assertion.State.ACTIVE, current_version__gt=0)
        .exclude(predicate__in=assertions.PROJECTED_PREDICATES).order_by("-updated_at", "id")
    )


def _session(owner_id: int, key: str) -> MemorySession:
    """The owner's session ``key``, created the first time (``get_or_create``); an existing
    one, which is every run but the first, is one SELECT (on PostgreSQL built once per
    process, ``memory.queries.session_sql``; SQLite takes the ORM)."""
    if statements.on_postgresql():
        sql, fields = queries.session_sql()
        found = statements.fetch(sql, [owner_id, key], fields)
        if found:
            return statements.instance(MemorySession, fields, found[0])
    else:
        existing = MemorySession.objects.filter(owner_id=owner_id, key=key).first()
        if existing is not None:
            return existing
    session, _ = MemorySession.objects.get_or_create(owner_id=owner_id, key=key)
    return session


def _fact_lines(rows: list[Assertion]) -> dict[str, str]:
    full = {r["id"]: r for r in assertions.serialize_current(rows)}
    lines = {}
    for a in rows:
        row = full[str(a.id)]
        mark = " — needs re-evaluation, do not rely on it without checking" if a.needs_reevaluation else ""
        lines[str(a.id)] = f"- [{a.predicate}] {assertions.payload_text(row['payload'])[:300]} (assertion {str(a.id)[:8]} v{a.current_version}){mark}"
    return lines


def plan(owner_id: int, scope: str, anchor: int, *, key: str = DEFAULT_KEY) -> InjectionPlan:
    """What this turn adds to the session; nothing is stored until ``accept``."""
    session = _session(owner_id, key)
    facts = visible_facts(owner_id, scope)
    current = {str(a.id): _token(a) for a in facts}
    baseline: dict[str, str] = dict(session.baseline or {})
    reason = ""
    if session.revision == 0:
        reason = "new_session"
    elif not session.scope:  # reset by a forget (its stored blocks held forgotten text)
        reason = session.reset_reason or "reset"
    elif session.scope != scope:
        reason = "scope_changed"
    elif any(i not in current for i in baseline):
        reason = "fact_deleted"
    elif any(current[i] != t for i, t in baseline.items()):
        reason = "fact_edited"
    elif len(session.blocks or []) >= MAX_BLOCKS:
        reason = "compacted"
    if reason:
        shown = facts[:MAX_FACTS]
        lines = _fact_lines(shown)
        text = ""
        if shown:
            more = len(facts) - len(shown)
            text = (
                "Yimi's memory (L3 assertions; this replaces anything said about memory earlier in this conversation):\n"
                + "\n".join(lines[str(a.id)] for a in shown)
                + (f"\n({more} older facts are not listed; recall finds them.)" if more else "")
            )
        return InjectionPlan(
            session.id, session.revision, scope, "rebuild", reason, [], Block(anchor, text) if text else None, current,
            [str(a.id) for a in shown],
        )
    new = [a for a in facts if str(a.id) not in baseline][:MAX_FACTS]
    earlier = [Block(int(b["anchor"]), str(b["text"])) for b in session.blocks or []]
    new_block = None
    if new:
        lines = _fact_lines(new)
        new_block = Block(anchor, "New in Yimi's memory since earlier in this conversation:\n" + "\n".join(lines[str(a.id)] for a in new))
    next_baseline = {**baseline, **{str(a.id): current[str(a.id)] for a in new}}
    return InjectionPlan(session.id, session.revision, scope, "incremental", "", earlier, new_block, next_baseline, [str(a.id) for a in new])


def accept(p: InjectionPlan) -> bool:
    """The brain accepted the prompt built from ``p``: advance the session.

    Steps: 1. ``UPDATE ... WHERE id = session AND revision = p.revision`` sets the new
    baseline, blocks, scope and revision + 1 (and generation + 1 for a rebuild); 2. a row
    count of 0 means the session moved on meanwhile (another run accepted, or a forget
    reset it): nothing is stored and the next run plans again from the stored state.

    An incremental plan that added nothing (no new facts: most turns) writes nothing: the
    stored session already is what the prompt was built from, so there is nothing to
    advance, and another run's plan made meanwhile is not made stale by it (issue 14: one
    UPDATE, and its WAL flush, on every run).
    """
    if p.mode == "incremental" and p.new_block is None:
        return True
    blocks = [b.as_dict() for b in p.blocks]
    rebuild = p.mode == "rebuild"
    now = timezone.now()
    if statements.on_postgresql():  # the UPDATE built once per process: memory.queries.accept_session_sql
        meta = MemorySession._meta
        values = [
            meta.get_field("baseline").get_db_prep_save(p.next_baseline, connection),  # type: ignore[union-attr]
            meta.get_field("blocks").get_db_prep_save(blocks, connection),  # type: ignore[union-attr]
            p.scope,
            connection.ops.adapt_datetimefield_value(now),
            *([p.reason] if rebuild else []),
        ]
        with connection.cursor() as cursor:
            cursor.execute(queries.accept_session_sql(rebuild), [*values, p.session_id, p.revision])
            advanced = cursor.rowcount == 1
    else:  # SQLite takes the ORM
        changes: dict[str, Any] = {
            "baseline": p.next_baseline, "blocks": blocks, "scope": p.scope, "revision": F("revision") + 1, "updated_at": now,
        }
        if rebuild:
            changes.update(generation=F("generation") + 1, reset_reason=p.reason)
        advanced = MemorySession.objects.filter(id=p.session_id, revision=p.revision).update(**changes) == 1
    if advanced and p.mode == "rebuild" and p.reason != "new_session":
        log_event("memory_session_reset", session_id=p.session_id, reason=p.reason)
    if not advanced:
        log_event("memory_session_moved_on", session_id=p.session_id)
    return advanced
