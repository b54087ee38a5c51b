"""Activity cards: a card shows the receipt's status as it is, including ``unknown`` and
``waiting``, and its facts in the owner's wording (never the model's instructions)."""

from __future__ import annotations

from typing import Any

from capabilities.truth.facts import STATUSES, render_facts
from yimi_project.leaks import redact_markers


def activity_card(task_id: str, title: str, receipt: dict[str, Any]) -> dict[str, Any]:
    """An activity card. Its status is the receipt's status as is (unknown, waiting, …);
    its facts are the owner's wording of them, without the facts only the model reads. The
    title (the run's goal, model-written) and the facts (pack-reported values) go to every
    device, so internal markers in them (ids, tool names, data paths, tokens) are redacted
    as in every other text a device receives (``yimi_project.leaks``)."""
    status = receipt.get("status") if receipt.get("status") in STATUSES else "unknown"
    return {
        "task_id": task_id,
        "title": redact_markers(title),
        "status": status,
        "facts": [redact_markers(f.text) for f in render_facts(receipt, tool_label=title, key=task_id) if f.for_owner],
    }
