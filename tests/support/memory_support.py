"""The short context's clock in a test's hands (``memory.short_context.wait_source_deadline``)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from memory import short_context


@dataclass
class SourceDeadlines:
    """A source's time is up only when the test says so, never because the machine was
    slow: for a name in ``passes``, once its event is set; for any other, never (its
    answer ends the wait). ``asked`` records every (source, seconds) waited for."""

    passes: dict[str, threading.Event] = field(default_factory=dict)
    asked: list[tuple[str, float]] = field(default_factory=list)

    async def wait(self, name: str, seconds: float) -> None:
        self.asked.append((name, seconds))
        if name not in self.passes:
            await asyncio.Event().wait()
        while not self.passes[name].is_set():  # set by another thread: looked at, not timed
            await asyncio.sleep(0.01)


def hold_source_deadlines(monkeypatch: Any) -> SourceDeadlines:
    deadlines = SourceDeadlines()
    monkeypatch.setattr(short_context, "wait_source_deadline", deadlines.wait)
    return deadlines
