"""Text embeddings for recall's vector list: the interface, a test embedder, the index.

An embedding model comes from the local model catalog: once a switch's index rebuild has
finished (``llm.vector_index``, which stores its vectors here), the catalog's effective
embedding model is recall's embedder. The catalog is the model authority's (``llm``, a
layer above, which memory never imports): llm registers it here when Django starts
(``register_catalog_embedder``). ``settings.YIMI_EMBEDDING_MODEL`` can name a registered
embedder instead (tests, benchmarks). Without either, recall uses keyword search alone.
Nothing here downloads anything.

``HashingEmbedder`` is a real but tiny embedder for tests and benchmarks: character
unigrams and bigrams hashed (BLAKE2b) into signed buckets, L2-normalized. Texts sharing
words score high, unrelated texts near zero.

Vectors are stored per (timeline entry, model) as float32 bytes (``TimelineEmbedding``);
``index_timeline`` fills in entries that have none yet (a bounded batch, also run by the
Celery task ``memory.tasks.index_timeline_embeddings``). Search is exact cosine over the
owner's vectors, kept in memory per process and brought up to date by a count/max query
before each search, with numpy when it is installed and plain Python otherwise.
"""

from __future__ import annotations

import hashlib
import math
import threading
import unicodedata
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from django.conf import settings
from django.db import connection
from django.db.models import Count, Max

from memory.timeline.models import TimelineEmbedding, TimelineEntry
from yimi_project.logs import log_event

try:  # optional: faster search when available
    import numpy as np
except ImportError:  # pragma: no cover - depends on the environment
    np = None  # type: ignore[assignment]


@runtime_checkable
class Embedder(Protocol):
    """What recall needs from an embedding model."""

    name: str  # stored with every vector; vectors of different models never mix
    dim: int

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One L2-normalized vector of ``dim`` floats per text, in order."""
        ...


class HashingEmbedder:
    """Deterministic character n-gram hashing (no model, for tests and benchmarks)."""

    name = "test-hashing-64"

    def __init__(self, dim: int = 64) -> None:
        self.dim = dim
        if dim != 64:
            self.name = f"test-hashing-{dim}"

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self._one(t) for t in texts]

    def _one(self, text: str) -> list[float]:
        vec = [0.0] * self.dim
        chars = [c for c in unicodedata.normalize("NFKC", text).lower() if not c.isspace()]
        grams = chars + [a + b for a, b in zip(chars, chars[1:])]
        for gram in grams:
            digest = hashlib.blake2b(gram.encode("utf-8"), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % self.dim
            vec[bucket] += 1.0 if digest[4] & 1 else -1.0
        norm = math.sqrt(sum(v * v for v in vec))
        return [v / norm for v in vec] if norm else vec


_FACTORIES: dict[str, Callable[[], Embedder]] = {HashingEmbedder.name: HashingEmbedder}


def register_embedder(name: str, factory: Callable[[], Embedder]) -> None:
    """Make an embedding model available under ``name`` (for ``settings.YIMI_EMBEDDING_MODEL``)."""
    _FACTORIES[name] = factory


# The catalog's effective embedding model, or None: ``llm.vector_index.effective_embedder``.
_CATALOG_EMBEDDER: list[Callable[[], Embedder | None]] = []


def register_catalog_embedder(provider: Callable[[], Embedder | None]) -> None:
    """Called from the model authority's ``AppConfig.ready`` (``llm``): ``provider`` gives
    the local catalog's effective embedding model, or None when there is none."""
    _CATALOG_EMBEDDER[:] = [provider]


def configured_embedder() -> Embedder | None:
    """The embedder named by ``settings.YIMI_EMBEDDING_MODEL``; else the catalog's effective
    embedding model (effective only once its index was rebuilt); else None (keyword only)."""
    name = getattr(settings, "YIMI_EMBEDDING_MODEL", "") or ""
    if not name:
        return _CATALOG_EMBEDDER[0]() if _CATALOG_EMBEDDER else None
    factory = _FACTORIES.get(name)
    if factory is None:
        log_event("embedding_model_unknown", model=name)
        return None
    return factory()


def to_bytes(vector: Sequence[float]) -> bytes:
    return array("f", vector).tobytes()


def from_bytes(blob: bytes) -> array:
    out = array("f")
    out.frombytes(bytes(blob))
    return out


def index_timeline(owner_id: int, embedder: Embedder, *, limit: int = 500, batch: int = 100, recent: int | None = None) -> int:
    """Embed up to ``limit`` of the owner's entries that have no vector for this model yet
    (newest first); returns how many were stored. With ``recent``, only the newest
    ``recent`` entries are looked at (cheap enough to run before every search)."""
    if recent is not None:
        newest = list(TimelineEntry.objects.filter(owner_id=owner_id, erased_at__isnull=True).order_by("-seq").values_list("id", "text")[:recent])
        have = set(
            TimelineEmbedding.objects.filter(model=embedder.name, entry_id__in=[i for i, _ in newest]).values_list("entry_id", flat=True)
        )
        todo = [(i, t) for i, t in newest if i not in have][:limit]
    else:
        done = TimelineEmbedding.objects.filter(owner_id=owner_id, model=embedder.name).values("entry_id")
        todo = list(
            TimelineEntry.objects.filter(owner_id=owner_id, erased_at__isnull=True).exclude(id__in=done).order_by("-seq").values_list("id", "text")[:limit]
        )
    stored = 0
    for i in range(0, len(todo), batch):
        chunk = todo[i : i + batch]
        vectors = embedder.embed([text for _, text in chunk])
        rows = [
            TimelineEmbedding(entry_id=eid, owner_id=owner_id, model=embedder.name, dim=embedder.dim, vector=to_bytes(vec))
            for (eid, _), vec in zip(chunk, vectors)
            if len(vec) == embedder.dim
        ]
        TimelineEmbedding.objects.bulk_create(rows, ignore_conflicts=True)
        stored += len(rows)
    if stored:  # this process wrote: never trust a cached view of these rows
        with _CACHE_LOCK:
            _CACHE.pop((connection.settings_dict.get("NAME") or "", owner_id, embedder.name), None)
    return stored


def replace_model_vectors(owner_id: int, model: str, entry_ids: Sequence[int], vectors: Any) -> int:
    """Store a freshly built index for one model at once (the catalog's rebuild after a
    switch): the owner's old rows for that model are replaced in one transaction."""
    from django.db import transaction

    dim = int(vectors.shape[1]) if len(entry_ids) else 0
    rows = [
        TimelineEmbedding(entry_id=eid, owner_id=owner_id, model=model, dim=dim, vector=to_bytes(list(map(float, vec))))
        for eid, vec in zip(entry_ids, vectors)
    ]
    with transaction.atomic():
        TimelineEmbedding.objects.filter(owner_id=owner_id, model=model).delete()
        TimelineEmbedding.objects.bulk_create(rows, batch_size=500)
    with _CACHE_LOCK:
        _CACHE.pop((connection.settings_dict.get("NAME") or "", owner_id, model), None)
    return len(rows)


def model_vectors(owner_id: int, model: str) -> list[tuple[int, bytes]]:
    """(timeline seq, vector bytes) of every stored row for one model, in timeline order."""
    return list(
        TimelineEmbedding.objects.filter(owner_id=owner_id, model=model).order_by("entry__seq").values_list("entry__seq", "vector")
    )


@dataclass
class _Vectors:
    """One owner's vectors for one model, as loaded: entry ids and rows (float32)."""

    count: int
    last_row: int  # highest TimelineEmbedding id loaded
    entry_ids: list[int]
    rows: Any  # numpy matrix, or a list of arrays without numpy


_CACHE: dict[tuple[str, int, str], _Vectors] = {}
_CACHE_LOCK = threading.Lock()


def clear_vector_cache() -> None:
    with _CACHE_LOCK:
        _CACHE.clear()


def _stack(blobs: list[bytes], dim: int) -> Any:
    if np is not None:
        return np.frombuffer(b"".join(bytes(b) for b in blobs), dtype=np.float32).reshape(len(blobs), dim)
    return [from_bytes(b) for b in blobs]


def _vectors(owner_id: int, embedder: Embedder) -> _Vectors:
    """The owner's vectors, cached per process: a cheap count/max query decides whether the
    cache is current, only new rows are loaded when rows were added, and anything else
    (rows deleted with their entries) reloads everything."""
    qs = TimelineEmbedding.objects.filter(owner_id=owner_id, model=embedder.name, dim=embedder.dim)
    stats = qs.aggregate(count=Count("id"), last=Max("id"))
    count, last = stats["count"] or 0, stats["last"] or 0
    key = (connection.settings_dict.get("NAME") or "", owner_id, embedder.name)
    with _CACHE_LOCK:
        cached = _CACHE.get(key)
    if cached is not None and (cached.count, cached.last_row) == (count, last):
        return cached
    if cached is not None and count > cached.count and last > cached.last_row:
        new = list(qs.filter(id__gt=cached.last_row).order_by("id").values_list("id", "entry_id", "vector"))
        if cached.count + len(new) == count:
            rows = _stack([v for _, _, v in new], embedder.dim)
            merged = np.vstack([cached.rows, rows]) if np is not None else [*cached.rows, *rows]
            fresh = _Vectors(count, last, [*cached.entry_ids, *(e for _, e, _ in new)], merged)
            with _CACHE_LOCK:
                _CACHE[key] = fresh
            return fresh
    loaded = list(qs.order_by("id").values_list("id", "entry_id", "vector"))
    fresh = _Vectors(len(loaded), loaded[-1][0] if loaded else 0, [e for _, e, _ in loaded], _stack([v for _, _, v in loaded], embedder.dim))
    with _CACHE_LOCK:
        _CACHE[key] = fresh
    return fresh


def nearest(owner_id: int, embedder: Embedder, query: str, *, limit: int = 100, min_similarity: float = 0.0) -> list[int]:
    """Timeline entry ids by cosine similarity to ``query``, best first, at most ``limit``,
    only those above ``min_similarity``. An id may name an entry deleted since it was
    loaded: callers skip those (``memory.recall.rrf``'s ``alive``)."""
    vectors = _vectors(owner_id, embedder)
    if not vectors.count:
        return []
    (q,) = embedder.embed([query])
    if np is not None:
        scores = vectors.rows @ np.asarray(q, dtype=np.float32)
        top = np.argpartition(-scores, limit - 1)[:limit] if len(scores) > limit else np.arange(len(scores))
        order = top[np.lexsort((top, -scores[top]))]  # best first, ties by load order
        return [vectors.entry_ids[i] for i in order if scores[i] > min_similarity]
    scored = sorted(
        ((sum(a * b for a, b in zip(row, q)), i) for i, row in enumerate(vectors.rows)), key=lambda s: -s[0]
    )
    return [vectors.entry_ids[i] for score, i in scored[:limit] if score > min_similarity]
