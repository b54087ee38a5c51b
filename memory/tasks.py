"""Celery tasks of the memory app (registered through ``app.autodiscover_tasks()``)."""

from __future__ import annotations

from celery import shared_task

from accounts.services import get_owner
from memory.archive import cold_store as archive
from memory.assertions.projections import regenerate
from memory.timeline.embeddings import configured_embedder, index_timeline


@shared_task(name="memory.tasks.regenerate_projections")
def regenerate_projections_task() -> list[str]:
    """Rewrite any stale projection (commits regenerate them already; this heals misses)."""
    owner = get_owner()
    return regenerate(owner.pk) if owner is not None else []


@shared_task(name="memory.tasks.index_timeline_embeddings")
def index_timeline_embeddings_task(limit: int = 2000) -> int:
    """Embed timeline entries that have no vector yet, when an embedding model is set."""
    embedder, owner = configured_embedder(), get_owner()
    if embedder is None or owner is None:
        return 0
    return index_timeline(owner.pk, embedder, limit=limit)


@shared_task(name="memory.tasks.archive_round")
def archive_round_task() -> dict[str, object]:
    """One cold-pack migration round and the due hot-copy releases (memory.archive.cold_store); beat
    runs it every minute. Without cold storage configured it does nothing."""
    owner = get_owner()
    if owner is None:
        return {"stopped": "no_owner"}
    return archive.migrate_round(owner.pk).as_dict()
