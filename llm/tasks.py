"""The llm app's Celery tasks: probing a model draft's endpoint (``llm.role_drafts.dispatch_probe``)
and rebuilding the vector index after an embedding model switch (started by its name,
``llm.model_settings.REBUILD_VECTOR_INDEX``: this module imports the modules that do the
work, so theirs must not import it).

Both keep the names they were registered under before they moved here (messages already
queued on an installed instance carry those names): ``brain.tasks.probe_model_draft`` and
``devices.rebuild_vector_index``.
"""

from __future__ import annotations

from celery import shared_task

from llm.model_settings import REBUILD_VECTOR_INDEX


@shared_task(name="brain.tasks.probe_model_draft")
def probe_draft_task(draft_id: str) -> str:
    from llm import role_drafts
    from yimi_project.errors import YimiError

    try:
        return role_drafts.probe_draft(draft_id).probe_status
    except YimiError as exc:
        return exc.code


@shared_task(name=REBUILD_VECTOR_INDEX, acks_late=True)
def rebuild_vector_index_task(model_id: str, version: str) -> str:
    from llm.vector_index import rebuild_vector_index

    return rebuild_vector_index(model_id, version)
