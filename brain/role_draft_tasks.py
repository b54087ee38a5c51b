"""The Celery task that probes a model draft's endpoint (``brain.role_drafts.dispatch_probe``)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="brain.tasks.probe_model_draft")
def probe_draft_task(draft_id: str) -> str:
    from brain import role_drafts
    from yimi_project.errors import YimiError

    try:
        return role_drafts.probe_draft(draft_id).probe_status
    except YimiError as exc:
        return exc.code
