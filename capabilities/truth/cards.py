"""Activity cards: a card shows the receipt's status as it is, including ``unknown`` and
``waiting``, and its facts in the owner's wording (never the model's instructions)."""

from __future__ import annotations

from typing import Any

from capabilities.truth.facts import STATUSES, render_facts


def activity_card(task_id: str, title: str, receipt: dict[str, Any]) -> dict[str, Any]:
    """An activity card. Its status is the receipt's status as is (unknown, waiting, …);
    its facts are the owner's wording of them, without the facts only the model reads."""
    status = receipt.get("status") if receipt.get("status") in STATUSES else "unknown"
    return {
        "task_id": task_id,
        "title": title,
        "status": status,
        "facts": [f.text for f in render_facts(receipt, tool_label=title, key=task_id) if f.for_owner],
    }
