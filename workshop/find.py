"""``capability_find``: is there already something that does this? (flow F4)

Three sources, searched in this order, each on its own:

- ``packs``: the packs installed here (``capabilities.manifest.load_packs``; those that are
  off are listed too, marked ``enabled: false``). A hit is used as it is: ``action: use``.
- ``skills``: the local skill index (``YIMI_WORKSHOP_SKILL_INDEX``), an offline snapshot of
  a skill market;
- ``mcp``: the local MCP registry index (``YIMI_WORKSHOP_MCP_INDEX``), an offline snapshot
  of the MCP server registry.

A source that is missing, unreadable or not in the index format is reported in
``sources`` (``{name, status, error}``, status ``ok``, ``unavailable`` or ``invalid``) and
the search carries on with the others: "not found" is never claimed for a source that was
not searched. An index entry that breaks the format is skipped and counted.

Index format (JSON, one file per source; examples in ``workshop/indexes/``)::

    {"format": 1, "label": "skill market snapshot", "updated_at": "2026-11-30",
     "entries": [{"id": "parcel-tracker", "name": "Parcel tracker",
                  "description": "Track parcels by tracking number.",
                  "keywords": ["parcel", "快递"],                    # optional
                  "tools": [{"name": "track", "description": "..."}],  # optional
                  "source_dir": "sources/parcel-tracker"}]}           # optional, see below

``source_dir`` (relative to the index file) is a local copy of the entry's code: only such
an entry can be reused (``action: reuse``: a manifest and a receipt wrapper are written
around it, ``workshop.drafts``); without it the entry is a reference for a template
build (``action: reference``).

Ranking is simple and explained: the query is split into terms (words; Chinese text into
overlapping two-character pieces); a term found in an entry's name or id scores 3, in its
keywords 3, in a tool's name 2, in a description 1 (each field counts once per term).
Results are ordered by score, then installed packs first, then by name; each carries
``why``, the matches that made its score.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from capabilities.manifest import SEPARATOR, ManifestError, load_pack, load_packs
from yimi_project.errors import YimiError

MAX_QUERY_CHARS = 200
MAX_RESULTS = 20
INDEX_FORMAT = 1
WEIGHTS = (("name", 3), ("keywords", 3), ("tools", 2), ("description", 1))
WORD = re.compile(r"[a-z0-9][a-z0-9_-]*")
HAN = re.compile(r"[\u3400-\u9fff]+")
STOP_WORDS = frozenset({"a", "an", "the", "to", "of", "and", "or", "in", "on", "for", "me", "my", "i", "it", "is", "when"})


@dataclass
class Entry:
    source: str
    id: str
    name: str
    description: str
    keywords: list[str] = field(default_factory=list)
    tools: list[dict[str, str]] = field(default_factory=list)
    source_dir: Path | None = None
    enabled: bool = True


@dataclass
class SourceReport:
    name: str
    status: str = "ok"
    error: str | None = None
    entries: int = 0
    skipped: int = 0


def terms(query: str) -> list[str]:
    """The query's search terms: lower-case words (stop words dropped) and, for Chinese,
    every two-character piece (a single character alone)."""
    text = query.lower()
    found = [w for w in WORD.findall(text) if w not in STOP_WORDS]
    for run in HAN.findall(text):
        found += [run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)]
    return list(dict.fromkeys(found))


def installed_entries() -> list[Entry]:
    packs = load_packs()
    entries = [
        Entry(
            "packs", pack.name, pack.name, pack.description,
            tools=[{"name": t.full_name, "description": str(t.spec.get("description", ""))} for t in pack.tools.values()],
        )
        for pack in packs.packs.values()
    ]
    return entries + disabled_entries(packs)


def disabled_entries(packs: Any) -> list[Entry]:
    """Installed packs that are off: their manifests, read again (the loader keeps only the
    reason they are off)."""
    found = []
    for name in packs.disabled:
        try:
            pack = load_pack(Path(settings.YIMI_PACKS_DIR) / name)
        except ManifestError:
            continue
        tools = [{"name": f"{pack.name}{SEPARATOR}{t}", "description": str(d.spec.get("description", ""))} for t, d in pack.tools.items()]
        found.append(Entry("packs", pack.name, pack.name, pack.description, tools=tools, enabled=False))
    return found


def read_index(name: str, path: Path) -> tuple[list[Entry], SourceReport]:
    """The entries of one index file and how reading it went (never raises)."""
    report = SourceReport(name)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        report.status, report.error = "unavailable", f"no index file {path.name} (the deployer refreshes it)"
        return [], report
    except OSError as exc:
        report.status, report.error = "unavailable", f"cannot read {path.name} ({exc.strerror or exc})"
        return [], report
    except ValueError as exc:
        report.status, report.error = "invalid", f"{path.name} is not valid JSON ({exc})"
        return [], report
    if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT or not isinstance(data.get("entries"), list):
        report.status, report.error = "invalid", f"{path.name} is not an index (format {INDEX_FORMAT} with a list of entries)"
        return [], report
    entries = []
    for raw in data["entries"]:
        entry = _entry(name, raw, path.parent)
        if entry is None:
            report.skipped += 1
        else:
            entries.append(entry)
    report.entries = len(entries)
    return entries, report


def _entry(source: str, raw: Any, base: Path) -> Entry | None:
    if not isinstance(raw, dict) or not all(isinstance(raw.get(k), str) and raw[k] for k in ("id", "name", "description")):
        return None
    keywords = raw.get("keywords", [])
    tools = raw.get("tools", [])
    if not isinstance(keywords, list) or not all(isinstance(k, str) for k in keywords):
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools):
        return None
    source_dir = None
    if isinstance(raw.get("source_dir"), str):
        candidate = (base / raw["source_dir"]).resolve()
        if candidate.is_relative_to(base.resolve()) and candidate.is_dir():
            source_dir = candidate
    return Entry(
        source, raw["id"], raw["name"], raw["description"], keywords=keywords,
        tools=[{"name": t["name"], "description": str(t.get("description", ""))} for t in tools], source_dir=source_dir,
    )


def index_paths() -> dict[str, Path]:
    return {"skills": Path(settings.YIMI_WORKSHOP_SKILL_INDEX), "mcp": Path(settings.YIMI_WORKSHOP_MCP_INDEX)}


def gather() -> tuple[list[Entry], list[SourceReport]]:
    """Every entry of every source that could be read, and a report per source."""
    entries: list[Entry] = []
    reports = []
    packs = SourceReport("packs")
    try:
        found = installed_entries()
        entries += found
        packs.entries = len(found)
    except Exception as exc:  # noqa: BLE001 - one source failing must not stop the search
        packs.status, packs.error = "unavailable", f"the installed packs could not be read ({type(exc).__name__})"
    reports.append(packs)
    for name, path in index_paths().items():
        found, report = read_index(name, path)
        entries += found
        reports.append(report)
    return entries, reports


def score(entry: Entry, wanted: list[str]) -> tuple[int, list[str]]:
    fields = {
        "name": f"{entry.id} {entry.name}".lower(),
        "keywords": " ".join(entry.keywords).lower(),
        "tools": " ".join(t["name"] for t in entry.tools).lower(),
        "description": " ".join([entry.description, *(t["description"] for t in entry.tools)]).lower(),
    }
    total, why = 0, []
    for term in wanted:
        for label, weight in WEIGHTS:
            if term in fields[label]:
                total += weight
                why.append(f"{term!r} in {label} (+{weight})")
    return total, why


def find_entry(source: str, entry_id: str) -> Entry | None:
    """One index entry by source and id (what a reuse build names), or None."""
    path = index_paths().get(source)
    if path is None:
        return None
    entries, _ = read_index(source, path)
    return next((e for e in entries if e.id == entry_id), None)


def capability_find(query: str) -> dict[str, Any]:
    """Search the installed packs, the skill index and the MCP index for ``query``."""
    if not isinstance(query, str) or not query.strip() or len(query) > MAX_QUERY_CHARS:
        raise YimiError("invalid_request", f"query is a non-empty text of at most {MAX_QUERY_CHARS} characters")
    wanted = terms(query)
    if not wanted:
        raise YimiError("invalid_request", "the query has no words to search for")
    entries, reports = gather()
    order = {"packs": 0, "skills": 1, "mcp": 2}
    scored = [(s, why, e) for e in entries for s, why in [score(e, wanted)] if s > 0]
    scored.sort(key=lambda item: (-item[0], order[item[2].source], item[2].name.lower()))
    results = []
    for points, why, entry in scored[:MAX_RESULTS]:
        action = "use" if entry.source == "packs" else "reuse" if entry.source_dir is not None else "reference"
        result: dict[str, Any] = {
            "source": entry.source, "id": entry.id, "name": entry.name, "description": entry.description,
            "score": points, "why": why, "action": action, "tools": entry.tools,
        }
        if entry.source == "packs":
            result["enabled"] = entry.enabled
        results.append(result)
    return {
        "query": query, "terms": wanted, "results": results,
        "sources": [{"name": r.name, "status": r.status, "error": r.error, "entries": r.entries, "skipped": r.skipped} for r in reports],
    }
