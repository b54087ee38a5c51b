"""Who must hear that a memory source changed: forgotten, edited or erased.

Apps above memory keep things derived from the owner's memory (the companion's call
snapshots, summaries and topic progress in ``companion``). Memory cannot import them, so each
registers a listener here when Django starts (``AppConfig.ready``), the same seam as
``memory.copies``; ``assertions.forget``, ``assertions.commit`` (a new version of an
existing assertion) and ``erasure.erase`` call ``notify`` inside their transaction, so a
listener's writes commit or roll back with the change itself. A listener that fails rolls
the change back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceChange:
    """One change to the owner's memory that invalidates what was derived from it."""

    owner_id: int
    reason: str  # FORGOTTEN, EDITED or ERASED
    assertion_ids: tuple[str, ...] = ()  # L3 assertions forgotten or edited
    entry_ids: tuple[int, ...] = ()  # L4 timeline entries erased


FORGOTTEN = "memory_forgotten"
EDITED = "memory_edited"
ERASED = "timeline_erased"

Listener = Callable[[SourceChange], None]
_LISTENERS: dict[str, Listener] = {}


def register(app: str, listener: Listener) -> None:
    """Called from an app's ``AppConfig.ready``: ``listener`` hears every source change."""
    _LISTENERS[app] = listener


def notify(change: SourceChange) -> None:
    """Tell every registered app, in a fixed order, inside the caller's transaction."""
    for _, listener in sorted(_LISTENERS.items()):
        listener(change)
