"""Recall (flow F7): pick layers per question, search them, fuse ranked lists with RRF.

- ``choose_layers``: L3 always; the timeline (L4) when the question points at something
  said or done at some time; L5 (raw originals) when it points at something seen or heard:
  the original (an audio segment or an image) found by time and source and fetched from
  the hot store or its cold pack (``memory.archive.raw_recall``). If only L3 was chosen and it
  finds nothing, the timeline is searched too.
- Timeline search: a keyword list (``keyword_search``) and, when an embedding model is
  configured, a vector list (``memory.timeline.embeddings.nearest``), merged by reciprocal rank
  fusion ``1/(60 + rank)``, rank from 0, at most 100 items per list. An item whose original
  no longer exists is skipped where it stands: the list is not back-filled from below.
- Keyword search: the question is cut into terms (Latin words; CJK runs as bigrams) and
  entries are ranked by how many terms they contain (terms made only of function
  characters weigh less), newest first on ties. On PostgreSQL, queries whose terms all
  can use an index are prefiltered through it — a Latin term of 3 or more characters through
  the ``pg_trgm`` GIN index on the text (migration 0003), a 2-character CJK term through
  the GIN index on the text's CJK character bigrams (a ``tsvector``
  column PostgreSQL computes at insert, migration 0005) — and matched exactly with
  ``ILIKE``/``strpos``; on SQLite the same query runs with ``LIKE``/``instr``
  (case-insensitive for ASCII) as the fallback. The statement is built in ``memory.queries``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import connection
from django.db.models import QuerySet

from memory import queries
from memory.archive import raw_recall
from memory.assertions import store as assertions
from memory.timeline.embeddings import Embedder, configured_embedder, index_timeline, nearest
from memory.timeline.entries import serialize_entry
from memory.timeline.models import TimelineEntry
from yimi_project.infra import statements

RRF_K = 60
LIST_MAX = 100
MAX_TERMS = 16
FUNCTION_CHARS = set("的了吗呢吧啊呀是在有我你他她它们这那哪什么怎谁个些一不就都也还和与或把被让给叫说")
LATIN_STOP = {
    "the", "a", "an", "what", "which", "who", "is", "was", "were", "are", "did", "do", "does", "i", "you", "me", "my",
    "it", "to", "of", "in", "on", "at", "and", "or", "that", "this", "for", "with", "about", "how", "when", "where",
}
TIMELINE_CUES = re.compile(
    r"刚才|刚刚|昨天|前天|今天|早上|晚上|上次|上周|上个月|那天|之前|以前|说过|提到|聊过|聊到|讲过|问过|什么时候|几点|"
    r"\b(when|yesterday|today|earlier|last time|last week|said|say|mentioned|talked|told|asked)\b"
)
L5_CUES = re.compile(
    r"看到|看见|画面|照片|图片|拍的|视频|录音|听到|那家店|店名|招牌|"
    r"\b(saw|see|seen|photo|picture|image|video|recording|heard|shop|store|sign)\b"
)

# The CJK characters whose runs become bigram terms; migration 0005's yimi_cjk_bigrams()
# indexes pairs from the same ranges (Extension A, Unified and Compatibility Ideographs).
CJK_RUN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]+")

K = TypeVar("K", bound=Hashable)


# --- reciprocal rank fusion ------------------------------------------------------------------


def rrf(
    lists: Sequence[Sequence[K]],
    *,
    alive: Callable[[K], bool] | None = None,
    k: int = RRF_K,
    per_list: int = LIST_MAX,
) -> list[tuple[K, float]]:
    """Fuse ranked lists: ``score(x) = Σ 1/(k + rank)`` over the lists containing ``x``,
    rank from 0. Each list is cut to ``per_list`` items first; an item for which
    ``alive`` is false is skipped in place (its rank stays taken, nothing from below the
    cut moves up). Ties keep the order of first appearance."""
    scores: dict[K, float] = {}
    for items in lists:
        for rank, item in enumerate(items[:per_list]):
            if alive is not None and not alive(item):
                continue
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    order = {item: i for i, item in enumerate(scores)}
    return sorted(scores.items(), key=lambda kv: (-kv[1], order[kv[0]]))


# --- keyword search ----------------------------------------------------------------------------


def query_terms(text: str) -> list[tuple[str, float]]:
    """Search terms with weights: Latin words (≥2 characters, no stop words) and, for each
    run of CJK characters, the run itself if it is 1-2 characters long, else its bigrams.
    A term made only of function characters is dropped; one containing any weighs 0.5."""
    normalized = unicodedata.normalize("NFKC", text).lower()
    terms: dict[str, float] = {}
    for word in re.findall(r"[a-z0-9][a-z0-9_'-]*", normalized):
        if len(word) >= 2 and word not in LATIN_STOP:
            terms.setdefault(word, 1.0)
    for run in CJK_RUN.findall(normalized):
        grams = [run] if len(run) <= 2 else [run[i : i + 2] for i in range(len(run) - 1)]
        for gram in grams:
            function = sum(1 for c in gram if c in FUNCTION_CHARS)
            if function == len(gram):
                continue
            terms.setdefault(gram, 0.5 if function else 1.0)
    return list(terms.items())[:MAX_TERMS]


def _like(term: str) -> str:
    escaped = term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def keyword_backend() -> str:
    # The keyword search differs by database by nature: each its own text functions and indexes.
    if not statements.on_postgresql():
        return "sqlite-like"
    with connection.cursor() as cursor:
        cursor.execute(queries.TRIGRAM_INDEX_SQL)
        return "postgresql-trigram" if cursor.fetchone() else "postgresql-ilike"


def _index_prefilter(terms: list[tuple[str, float]]) -> tuple[tuple[int, bool], list[str]] | None:
    """An indexed prefilter for ``terms`` (``memory.queries.keyword_search_sql``: the number of
    Latin terms, whether there are CJK bigrams) with its parameters, or None when some term
    has no index to use. CJK terms are 1-2 characters (``query_terms`` cuts longer runs into
    bigrams): a 2-character one is one lexeme of the bigram column, all of them OR-ed in one
    ``tsquery``; a Latin term of 3 or more characters goes through ``ILIKE`` and the trigram
    index."""
    latin: list[str] = []
    bigrams: list[str] = []
    for term, _ in terms:
        if len(term) == 2 and CJK_RUN.fullmatch(term):
            bigrams.append(f"'{term}'")  # CJK characters only: nothing to quote
        elif len(term) >= 3 and CJK_RUN.search(term) is None:
            latin.append(term)
        else:
            return None  # a 1-character CJK term, a 2-character word: only a scan finds it
    params = [_like(term) for term in latin]
    if bigrams:
        params.append(" | ".join(bigrams))
    return (len(latin), bool(bigrams)), params


def keyword_search(owner_id: int, query: str, *, limit: int = LIST_MAX, within: QuerySet[TimelineEntry] | None = None) -> list[int]:
    """The owner's timeline entry ids containing the query's terms, best first.

    Each row's score is computed once (a subquery). A term without letters (CJK) is
    matched with ``strpos``/``instr`` (nothing to case-fold, cheaper than ``ILIKE``), one
    with letters case-insensitively (``ILIKE`` on PostgreSQL, ``LIKE`` on SQLite). On
    PostgreSQL, when every term can use an index (``_index_prefilter``: Latin terms of 3
    or more characters through ``pg_trgm``, 2-character CJK terms through the bigram
    ``tsvector``), a prefilter lets the GIN indexes find the candidates instead of scanning
    the owner's rows; the score (``strpos``/``ILIKE``) keeps the result exact. ``within``
    (a queryset of the owner's entries) restricts the search to those rows (history
    search: a time range, no guests). The statement: ``memory.queries.keyword_search_sql``.
    """
    terms = query_terms(query)
    if not terms:
        return []
    postgres = statements.on_postgresql()  # both run it, each with its own text functions and indexes
    shape, params = [], []
    for term, weight in terms:
        letters = any(c.isalpha() and c.isascii() for c in term)
        shape.append((letters, weight))
        params.append(_like(term) if letters else term)
    restrict, restrict_params = "", []
    if within is not None:
        inner_sql, inner_params = within.values("id").query.sql_with_params()
        restrict, restrict_params = inner_sql, list(inner_params)
    indexed = _index_prefilter(terms) if postgres else None
    prefilter, prefilter_params = indexed if indexed is not None else (None, [])
    sql = queries.keyword_search_sql(tuple(shape), postgres=postgres, restrict=restrict, prefilter=prefilter)
    with statements.custom_plans(), connection.cursor() as cursor:  # a rare term and a common one want different plans
        cursor.execute(sql, [*params, owner_id, *restrict_params, *prefilter_params, limit])
        return [row[0] for row in cursor.fetchall()]


# --- timeline search ----------------------------------------------------------------------------


@dataclass
class TimelineHit:
    entry: TimelineEntry
    score: float
    lists: list[str]

    def payload(self) -> dict[str, Any]:
        return {**serialize_entry(self.entry), "score": round(self.score, 6), "lists": self.lists}


def search_timeline(owner_id: int, query: str, *, embedder: Embedder | None = None, limit: int = 10) -> list[TimelineHit]:
    """Keyword list + vector list (if an embedder is given), fused with RRF."""
    named: list[tuple[str, list[int]]] = [("keyword", keyword_search(owner_id, query))]
    if embedder is not None:
        index_timeline(owner_id, embedder, recent=200)  # catch up on the newest entries
        named.append(("vector", nearest(owner_id, embedder, query)))
    candidates = {i for _, items in named for i in items[:LIST_MAX]}
    entries = {e.id: e for e in TimelineEntry.objects.filter(owner_id=owner_id, id__in=candidates).select_related("reply_to")}
    fused = rrf([items for _, items in named], alive=lambda i: i in entries)
    return [
        TimelineHit(entries[i], score, [name for name, items in named if i in items[:LIST_MAX]])
        for i, score in fused[:limit]
    ]


# --- recall ----------------------------------------------------------------------------------


@dataclass
class RecallResult:
    question: str
    layers: list[str]
    assertions: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    originals: list[dict[str, Any]] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    keyword_backend: str = ""
    vector_model: str | None = None

    def payload(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "layers": self.layers,
            "assertions": self.assertions,
            "timeline": self.timeline,
            "originals": self.originals,
            "unavailable": self.unavailable,
            "keyword_backend": self.keyword_backend,
            "vector_model": self.vector_model,
        }


def choose_layers(question: str) -> list[str]:
    normalized = unicodedata.normalize("NFKC", question).lower()
    layers = ["l3"]
    if TIMELINE_CUES.search(normalized):
        layers.append("timeline")
    if L5_CUES.search(normalized):
        layers.append("l5")
    return layers


def search_assertions(owner_id: int, question: str, *, limit: int = 10) -> list[dict[str, Any]]:
    """Current L3 assertions whose text or predicate contains the question's terms."""
    terms = query_terms(question)
    if not terms:
        return []
    rows = assertions.query(owner_id, limit=500)
    scored = []
    for row in rows:
        haystack = f"{row['predicate']} {assertions.payload_text(row['payload'])}".lower()
        score = sum(w for t, w in terms if t in haystack)
        if score > 0:
            scored.append((score, row))
    scored.sort(key=lambda s: -s[0])
    return [row for _, row in scored[:limit]]


def recall(owner_id: int, question: str, *, layers: Sequence[str] | None = None, limit: int = 10, embedder: Embedder | None = None) -> RecallResult:
    """Answer material for one question from the layers it needs."""
    chosen = list(layers) if layers else choose_layers(question)
    embedder = embedder or configured_embedder()
    result = RecallResult(question=question, layers=chosen, vector_model=embedder.name if embedder else None)
    if "l3" in chosen:
        result.assertions = search_assertions(owner_id, question, limit=limit)
        if not result.assertions and "timeline" not in chosen and not layers:
            chosen.append("timeline")  # nothing believed about it: look at what was said
    if "timeline" in chosen:
        result.keyword_backend = keyword_backend()
        result.timeline = [hit.payload() for hit in search_timeline(owner_id, question, embedder=embedder, limit=limit)]
    if "l5" in chosen:
        result.originals = raw_recall.search_originals(owner_id, question, query_terms(question), rrf, limit=min(limit, 5))
        if not result.originals:
            result.unavailable["l5"] = "no original from that time and source is stored"
    return result
