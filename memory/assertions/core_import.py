"""Importing existing core-memory files (``MEMORY.md`` / ``USER.md``) into L3.

Each entry becomes a ``core_profile.entry`` assertion (``doc`` ``memory`` or ``user``),
committed through ``memory.assertions.store.commit`` with the actor ``import``. The request id
is derived from the file kind and the entry's text, so importing the same file again
replays the earlier commits (receipts) and brings in only entries added since: an entry
that was imported before is never imported twice, even if it was edited or forgotten
since.

Entries: sections separated by a line ``§`` (the format Yimi's projections and Hermes
use); else sections that start at markdown headings; else one entry per non-empty line
(list markers removed). HTML comments (the projections' header) are ignored.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from memory.assertions import store as assertions
from yimi_project.errors import YimiError

COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
LIST_MARKER = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")


def parse_entries(text: str) -> list[str]:
    text = COMMENT.sub("", text).replace("\r\n", "\n")
    lines = text.split("\n")
    if any(line.strip() == "§" for line in lines):
        chunks: list[list[str]] = [[]]
        for line in lines:
            if line.strip() == "§":
                chunks.append([])
            else:
                chunks[-1].append(line)
        entries = ["\n".join(c).strip() for c in chunks]
    elif any(line.lstrip().startswith("#") for line in lines):
        chunks = [[]]
        for line in lines:
            if line.lstrip().startswith("#") and any(x.strip() for x in chunks[-1]):
                chunks.append([])
            chunks[-1].append(line)
        entries = ["\n".join(c).strip() for c in chunks]
    else:
        entries = [LIST_MARKER.sub("", line).strip() for line in lines]
    return [e for e in entries if e]


@dataclass
class ImportReport:
    doc: str
    imported: list[str] = field(default_factory=list)  # assertion ids
    already: int = 0
    refused: list[str] = field(default_factory=list)  # reasons


def import_entries(owner_id: int, text: str, *, doc: str) -> ImportReport:
    if doc not in assertions.CORE_DOCS:
        raise ValueError("doc must be 'user' or 'memory'")
    report = ImportReport(doc)
    for entry in parse_entries(text):
        digest = hashlib.sha256(f"{doc}\n{' '.join(entry.split())}".encode()).hexdigest()[:48]
        try:
            result = assertions.commit(
                assertions.CommitRequest(
                    owner_id=owner_id, request_id=f"import:{digest}", predicate=assertions.CORE_PROFILE,
                    payload={"text": entry, "doc": doc}, expected_version=0, actor="import",
                )
            )
        except YimiError as exc:
            report.refused.append(f"{exc.code}: {exc.message} ({entry[:40]!r})")
            continue
        if result.replayed:
            report.already += 1
        else:
            report.imported.append(result.assertion_id)
    return report
