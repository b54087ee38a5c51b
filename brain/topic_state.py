"""Continuity of the companion between calls: summaries and topic state (issue 21, part two).

Placeholder written by the persona/snapshot part so that call start can already read the
continuity it will get: the topics helper replaces this module (and owns it afterwards)
with the real summaries and topic rows. Until then there is no continuity to read.
"""

from __future__ import annotations

from typing import Any


def continuity_for(owner_id: int) -> dict[str, Any]:
    """What the next call of ``owner_id`` may resume: ``latest_summary`` (text),
    ``resume_thread`` (text: one unfinished thread) and ``avoid_topics`` (texts the owner
    refused). Empty until the topics part is built."""
    return {"latest_summary": "", "resume_thread": "", "avoid_topics": []}
