"""Speaking preferences: how Yimi speaks to the owner (tone, expressions, habits).

They are one L3 assertion per owner with the predicate ``speaking.preferences`` and the
payload ``{"text": ...}``, so they are versioned, committed with compare-and-set and
forgotten like any other assertion; the commit service applies the limit (1,500
characters) and the protected rules (``memory.assertions.speaking_rules``) on every path. They are
projected read-only to ``memories/PERSONALITY.md``.
"""

from __future__ import annotations

from typing import Any

from memory.assertions import store as assertions
from memory.assertions.models import Assertion, AssertionVersion
from memory.assertions.store import SPEAKING_PREFERENCES, CommitRequest, CommitResult
from yimi_project.errors import YimiError


def current(owner_id: int) -> dict[str, Any]:
    """``{"assertion_id", "version", "text"}``; version 0 and empty text when none is set."""
    row = Assertion.objects.filter(owner_id=owner_id, predicate=SPEAKING_PREFERENCES, state=Assertion.State.ACTIVE).first()
    if row is None:
        return {"assertion_id": None, "version": 0, "text": ""}
    version = AssertionVersion.objects.filter(assertion=row, version=row.current_version).first()
    text = version.payload.get("text", "") if version is not None and isinstance(version.payload, dict) else ""
    return {"assertion_id": str(row.id), "version": row.current_version, "text": text}


def set_preferences(owner_id: int, text: Any, *, expected_version: int, request_id: str, actor: str = "owner") -> CommitResult:
    """Commit new speaking preferences on top of ``expected_version`` (0: the first ones)."""
    now = current(owner_id)
    return assertions.commit(
        CommitRequest(
            owner_id=owner_id,
            request_id=request_id,
            predicate=SPEAKING_PREFERENCES,
            payload={"text": text},
            expected_version=expected_version,
            assertion_id=None if now["assertion_id"] is None else assertions.parse_uuid(now["assertion_id"]),
            actor=actor,
        )
    )


def restore_previous(owner_id: int, *, expected_version: int, request_id: str, actor: str = "owner") -> CommitResult:
    """Commit the previous version's text as a new version (restoring twice goes back and
    forth between the last two). ``nothing_to_restore`` when there is no previous version."""
    now = current(owner_id)
    if now["assertion_id"] is None or now["version"] < 2:
        raise YimiError("nothing_to_restore", "there is no earlier version of the speaking preferences")
    previous = AssertionVersion.objects.filter(assertion_id=now["assertion_id"], version=now["version"] - 1).first()
    if previous is None or not isinstance(previous.payload, dict):
        raise YimiError("nothing_to_restore", "the earlier version of the speaking preferences is gone")
    return set_preferences(owner_id, previous.payload.get("text", ""), expected_version=expected_version, request_id=request_id, actor=actor)
