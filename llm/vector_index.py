"""The derived vector index: every timeline utterance and reply embedded with the selected
embedding model, rebuilt whenever that model is switched.

Text embedding models need their own runtime (the deployer runs one next to Yimi, e.g. a
local text-embeddings server serving the catalog's files); Yimi talks to it through the
OpenAI-compatible ``POST {endpoint}/embeddings``. The index is a derived copy stored in
memory's vector store (``memory.timeline.embeddings``, one row per timeline entry and model), the
same rows recall searches; a rebuild replaces a model's rows in one transaction.

Once its index is rebuilt, the catalog's effective embedding model is recall's embedder
(``effective_embedder``, registered with ``memory.timeline.embeddings`` in ``LlmConfig.ready``:
memory sits below llm and never imports it). The rebuild runs as the Celery task
``devices.rebuild_vector_index`` (``llm.tasks``, started by ``llm.model_settings``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np

from accounts.services import get_owner
from llm import catalog, model_settings
from llm.catalog import CatalogEntry
from memory.timeline import entries as timeline
from memory.timeline.embeddings import model_vectors, replace_model_vectors
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

BATCH = 32
INDEXED_KINDS = ("utterance", "reply")
TIMEOUT_SECONDS = 30.0


def rebuild_vector_index(model_id: str, version: str) -> str:
    """Rebuild the index for one embedding model; returns ``effective``, ``superseded`` or ``failed``.

    Steps: 1. find the entry and verify its files' digests; 2. read the owner's timeline
    page by page (``memory.timeline.entries.page_after``), keeping utterances and replies;
    3. embed them in batches of 32 through the model's runtime, recording progress
    done/total after each batch — if the selection moved on (another switch), stop;
    4. write the index files to a temporary directory and move it into place;
    5. compare-and-set the model effective (``model_settings.finish_rebuild``). Any
    failure is shown on the settings page and leaves the effective model as it was.
    """
    entry = catalog.load_catalog().find("embedding", model_id, version)
    try:
        if entry is None:
            raise YimiError("unknown_model", f"embedding {model_id}@{version} is no longer in the catalog")
        catalog.check_entry(entry)
        owner_id, items = _timeline_items()
        if not model_settings.rebuild_progress(model_id, version, 0, len(items)):
            return "superseded"
        vectors = np.zeros((len(items), int(entry.metadata["dim"])), dtype=np.float32)
        for start in range(0, len(items), BATCH):
            batch = items[start : start + BATCH]
            vectors[start : start + len(batch)] = embed_texts(entry, [text for _, _, text in batch])
            if not model_settings.rebuild_progress(model_id, version, start + len(batch), len(items)):
                return "superseded"
        if owner_id is not None:
            replace_model_vectors(owner_id, entry.key, [entry_id for entry_id, _, _ in items], vectors)
    except YimiError as exc:
        model_settings.fail_rebuild(model_id, version, exc)
        return "failed"
    if not model_settings.finish_rebuild(model_id, version):
        return "superseded"
    log_event("index_rebuilt", model=entry.key, items=len(items))
    return "effective"


def _timeline_items() -> tuple[int | None, list[tuple[int, int, str]]]:
    """The owner and their (entry id, seq, text) utterances and replies."""
    owner = get_owner()
    if owner is None:
        return None, []
    items: list[tuple[int, int, str]] = []
    after = 0
    while True:
        page = timeline.page_after(owner_id=owner.id, after=after, limit=200)
        items.extend((e.id, e.seq, e.text) for e in page.entries if e.kind in INDEXED_KINDS and e.text.strip())
        if not page.has_more:
            return owner.id, items
        after = page.next_after


def embed_texts(entry: CatalogEntry, texts: list[str]) -> np.ndarray:
    """Unit vectors for ``texts`` from the model's runtime (OpenAI-compatible embeddings)."""
    dim = int(entry.metadata["dim"])
    url = entry.metadata["endpoint"].rstrip("/") + "/embeddings"
    body = {"model": entry.metadata.get("model_name", entry.id), "input": texts}
    try:
        response = httpx.post(url, json=body, timeout=TIMEOUT_SECONDS)
    except httpx.HTTPError:
        raise YimiError("embedding_runtime_unreachable", f"embedding {entry.key}: its runtime could not be reached") from None
    if response.status_code != 200:
        raise YimiError("embedding_runtime_error", f"embedding {entry.key}: its runtime answered HTTP {response.status_code}")
    try:
        data: Any = response.json()["data"]
        rows = [item["embedding"] for item in sorted(data, key=lambda item: item["index"])]
        matrix = np.asarray(rows, dtype=np.float64)
    except (ValueError, KeyError, TypeError):
        raise YimiError("embedding_runtime_bad_response", f"embedding {entry.key}: unreadable answer from its runtime") from None
    if matrix.shape != (len(texts), dim) or not np.all(np.isfinite(matrix)):
        raise YimiError(
            "embedding_runtime_bad_response", f"embedding {entry.key}: expected {len(texts)} vectors of {dim} numbers"
        )
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (matrix / norms).astype(np.float32)


def read_index(entry: CatalogEntry) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(timeline numbers, unit vectors, meta) of a built index; ``index_missing`` if none."""
    owner = get_owner()
    rows = model_vectors(owner.id, entry.key) if owner is not None else []
    if not rows:
        raise YimiError("index_missing", f"there is no vector index for {entry.key}")
    seqs = np.array([seq for seq, _ in rows], dtype=np.int64)
    vectors = np.frombuffer(b"".join(bytes(v) for _, v in rows), dtype=np.float32).reshape(len(rows), -1)
    return seqs, vectors, {"model": entry.key, "dim": int(vectors.shape[1]), "count": len(rows)}


class CatalogEmbedder:
    """The local model catalog's embedding model, served by its own runtime
    (``embed_texts``); vectors are stored under ``model@version``."""

    def __init__(self, entry: CatalogEntry) -> None:
        self.entry = entry
        self.name = entry.key
        self.dim = int(entry.metadata["dim"])

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [list(map(float, row)) for row in embed_texts(self.entry, list(texts))]


def effective_embedder() -> CatalogEmbedder | None:
    """The catalog's effective embedding model (effective only once its index was rebuilt),
    or None (keyword only): recall's embedder when ``settings.YIMI_EMBEDDING_MODEL`` names none."""
    try:
        entry = model_settings.effective_entry("embedding")
    except Exception:  # noqa: BLE001 - no catalog, or an unreadable one: keyword only
        return None
    return CatalogEmbedder(entry) if entry is not None else None
