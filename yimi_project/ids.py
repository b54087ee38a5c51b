"""Ids that arrive from outside (frames, HTTP bodies, model arguments)."""

from __future__ import annotations

import uuid
from typing import Any

NIL = uuid.UUID(int=0)


def uuid_or_nil(value: Any) -> uuid.UUID:
    """``value`` as a UUID, or the nil UUID when it is not one. No row has the nil id, so a
    lookup with it finds nothing: a malformed id behaves like an unknown one."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return NIL
