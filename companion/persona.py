"""Persona versions: the one entry point for who the companion is (issue 21).

The only code that writes ``PersonaVersion``. A version is never edited: ``publish``
writes the next one and makes it effective, ``rename`` publishes a copy with a new name,
``point_back`` makes the version before the effective one effective again. A call freezes
the version effective at its start (``companion.snapshot``), so none of these changes a
call in progress; the next call start applies them.

``render`` turns a version into the persona part of a call's system prompt: it is always
built from the version's own fields, never from an earlier prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from companion.models import PersonaVersion
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

MAX_NAME = 32
MAX_FIELD = 1200
MAX_EXAMPLES = 5
MAX_EXAMPLE_CHARS = 200


@dataclass(frozen=True)
class PersonaFields:
    name: str
    identity: str
    rhythm: str
    fact_boundaries: str
    examples: tuple[tuple[str, str], ...] = ()  # (the owner says, she replies)


# Version 1 of every owner, created on first use: the same substance as the owner system
# prompt Yimi had before personas (brain.prompts.OWNER_SYSTEM).
DEFAULT = PersonaFields(
    name="Yimi (依米)",
    identity=(
        "A private assistant who belongs to one person, the owner. "
        "You talk with the owner across their phone, watch, Mac and glasses."
    ),
    rhythm="Answer briefly and warmly.",
    fact_boundaries="Never claim you did something you did not do.",
)


def _text(value: Any, field: str, limit: int, *, single_line: bool = False) -> str:
    if not isinstance(value, str) or not value.strip():
        raise YimiError("invalid_persona", f"{field}: a non-empty text is required")
    text = value.strip()
    if len(text) > limit:
        raise YimiError("invalid_persona", f"{field}: at most {limit} characters")
    if single_line and any(c in text for c in "\r\n"):
        raise YimiError("invalid_persona", f"{field}: one line")
    return text


def _examples(value: Any) -> list[dict[str, str]]:
    if value in (None, ""):
        return []
    if not isinstance(value, list) or len(value) > MAX_EXAMPLES:
        raise YimiError("invalid_persona", f"examples: a list of at most {MAX_EXAMPLES} {{owner, reply}} objects")
    out = []
    for item in value:
        if not isinstance(item, dict) or set(item) != {"owner", "reply"}:
            raise YimiError("invalid_persona", "examples: each is {\"owner\": text, \"reply\": text}")
        out.append({k: _text(item[k], f"examples.{k}", MAX_EXAMPLE_CHARS) for k in ("owner", "reply")})
    return out


def validate(data: dict[str, Any]) -> dict[str, Any]:
    """The fields of a new version, checked (bad input: ``invalid_persona``, nothing changes)."""
    return {
        "name": _text(data.get("name"), "name", MAX_NAME, single_line=True),
        "identity": _text(data.get("identity"), "identity", MAX_FIELD),
        "rhythm": _text(data.get("rhythm"), "rhythm", MAX_FIELD),
        "fact_boundaries": _text(data.get("fact_boundaries"), "fact_boundaries", MAX_FIELD),
        "examples": _examples(data.get("examples")),
    }


def _default_data() -> dict[str, Any]:
    return {
        "name": DEFAULT.name, "identity": DEFAULT.identity, "rhythm": DEFAULT.rhythm,
        "fact_boundaries": DEFAULT.fact_boundaries,
        "examples": [{"owner": o, "reply": r} for o, r in DEFAULT.examples],
    }


def _lock_versions(owner_id: int) -> list[PersonaVersion]:
    """The owner's versions, newest first, locked until the transaction ends: publishes and
    point-backs of one owner take turns."""
    return list(PersonaVersion.objects.select_for_update().filter(owner_id=owner_id).order_by("-version"))


def effective(owner_id: int) -> PersonaVersion:
    """The owner's effective version; version 1 (``DEFAULT``) is created on first use."""
    found = PersonaVersion.objects.filter(owner_id=owner_id, effective=True).first()
    if found is not None:
        return found
    try:
        with transaction.atomic():
            if not _lock_versions(owner_id):
                return PersonaVersion.objects.create(owner_id=owner_id, version=1, effective=True, note="default", **_default_data())
    except IntegrityError:  # another start created it meanwhile
        pass
    return PersonaVersion.objects.get(owner_id=owner_id, effective=True)


def publish(owner_id: int, data: dict[str, Any], *, note: str = "") -> PersonaVersion:
    """Publish the next version and make it effective.

    Steps, in one transaction: 1. validate (``invalid_persona``; nothing changes); 2. lock
    the owner's versions (creating the default first if there is none, so numbering starts
    at 1 for it); 3. clear the old ``effective`` flag and insert version max + 1 as
    effective (the partial unique index holds exactly one). Calls already started keep the
    version their snapshot froze.
    """
    fields = validate(data)
    effective(owner_id)
    with transaction.atomic():
        versions = _lock_versions(owner_id)
        number = (versions[0].version if versions else 0) + 1
        PersonaVersion.objects.filter(owner_id=owner_id, effective=True).update(effective=False)
        row = PersonaVersion.objects.create(owner_id=owner_id, version=number, effective=True, note=note[:200], **fields)
    log_event("persona_published", owner=owner_id, version=number)
    return row


def rename(owner_id: int, name: Any) -> PersonaVersion:
    """The owner renames her: a new version, the effective one's fields with the new name."""
    current = effective(owner_id)
    data = {
        "name": name, "identity": current.identity, "rhythm": current.rhythm,
        "fact_boundaries": current.fact_boundaries, "examples": current.examples,
    }
    return publish(owner_id, data, note=f"renamed from {current.name}")


def point_back(owner_id: int) -> PersonaVersion:
    """Make the version before the effective one effective again (one action; the versions
    themselves stay as they are). ``no_previous_persona`` when the effective one is the
    oldest.

    Steps, in one transaction: lock the owner's versions; find the effective one and the
    highest version below it; move the flag by two UPDATEs, the first conditional on the
    flag still being where it was read (a row count other than 1 is a lost race:
    ``conflict``, rolled back).
    """
    effective(owner_id)
    with transaction.atomic():
        versions = _lock_versions(owner_id)
        now = next(v for v in versions if v.effective)
        before = [v for v in versions if v.version < now.version]
        if not before:
            raise YimiError("no_previous_persona", "the effective persona is the first version; there is nothing to point back to")
        target = before[0]
        if PersonaVersion.objects.filter(id=now.id, effective=True).update(effective=False) != 1:
            raise YimiError("conflict", "the effective persona changed meanwhile; read it again")
        PersonaVersion.objects.filter(id=target.id).update(effective=True)
    log_event("persona_pointed_back", owner=owner_id, version=target.version, from_version=now.version)
    target.effective = True
    return target


def render(version: PersonaVersion) -> str:
    """The persona part of a system prompt, from the version's own fields only."""
    parts = [
        f"You are {version.name}. {version.identity}",
        f"How you reply: {version.rhythm}",
        f"What you never invent or claim: {version.fact_boundaries}",
    ]
    examples = [e for e in (version.examples or []) if isinstance(e, dict)]
    if examples:
        lines = "\n".join(f"Owner: {e.get('owner', '')}\n{version.name}: {e.get('reply', '')}" for e in examples)
        parts.append(f"Examples of your replies:\n{lines}")
    return "\n\n".join(parts)
