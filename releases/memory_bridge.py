"""Memory across a rollback (flow F6): before switching back, the owner's
current core memory is projected for the old version; on upgrading again, only the entries
added while the old version ran are imported.

The projection is kept with the release it is for: ``<release dir>/memory/USER.md`` and
``MEMORY.md`` (the format of ``memory.assertions.projections``: sections separated by ``§``), and
``projected.json``, the digests of every entry as projected. The old version reads and
writes those two files; the database is not restored by a rollback, so nothing else of
memory needs carrying.

Upgrading again, ``import_added_meanwhile`` reads the two files as the old version left
them, drops every entry whose digest was projected (it came from here, so it is already
in L3), and imports the rest through ``memory.assertions.core_import`` (actor ``import``). Its
request ids come from the entry's text, so running it twice replays the first run's
commits and adds nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import UTC, datetime
from pathlib import Path

from accounts.services import get_owner
from memory.assertions import core_import
from memory.assertions.projections import MEMORY_MD, USER_MD, render
from releases import pointers
from yimi_project.errors import YimiError
from yimi_project.files import write_atomically
from yimi_project.logs import log_event

MEMORY_DIR = "memory"
MANIFEST = "projected.json"
DOCS = {USER_MD: "user", MEMORY_MD: "memory"}


def entry_digest(doc: str, entry: str) -> str:
    """The same normalisation ``memory.assertions.core_import`` keys its request ids on."""
    return hashlib.sha256(f"{doc}\n{' '.join(entry.split())}".encode()).hexdigest()


def project_for(release_path: Path, owner_id: int) -> Path:
    """Write the owner's current core memory into ``<release dir>/memory/`` for that
    (older) release, with the manifest of what was projected. Returns the directory.

    Each file is written whole and atomically (``yimi_project.files``: 0600, fsync, rename,
    fsync of the directory); the manifest goes last, so a manifest on disk always describes
    files that are complete."""
    target = Path(release_path) / MEMORY_DIR
    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    files = render(owner_id)
    digests: dict[str, list[str]] = {}
    for name, doc in DOCS.items():
        text = files[name]
        write_atomically(target / name, text.encode(), mode=0o600)
        digests[doc] = [entry_digest(doc, e) for e in core_import.parse_entries(text)]
    manifest = {"owner_id": owner_id, "projected_at": datetime.now(UTC).isoformat(), "digests": digests}
    write_atomically(target / MANIFEST, json.dumps(manifest, indent=1).encode(), mode=0o600)
    log_event("release_memory_projected", entries=sum(len(v) for v in digests.values()))
    return target


def before_rollback(before: pointers.Pointers) -> None:
    """The ``before_switch`` hook of an automatic or operator rollback: project the owner's
    core memory for the previous release. Best effort: going back never waits on the
    database, so a failure is logged and the rollback goes on (a requested rollback, which
    is not urgent, projects with ``project_for`` and stops if that fails)."""
    try:
        owner = get_owner()
        if owner is not None and before.previous is not None:
            project_for(before.previous.path, owner.id)
    except Exception as exc:  # noqa: BLE001 - see above
        log_event("release_memory_projection_failed", logging.WARNING, error=type(exc).__name__)


def import_added_meanwhile(release_path: Path, owner_id: int) -> dict[str, core_import.ImportReport]:
    """Import the entries the old release added to its projected files (and only those).
    A release that was never projected for has nothing to bring back: ``{}``."""
    source = Path(release_path) / MEMORY_DIR
    try:
        manifest = json.loads((source / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise YimiError("release_memory_unreadable", f"the memory projection's manifest cannot be read ({exc}); nothing imported") from exc
    if manifest.get("owner_id") != owner_id:
        raise YimiError("release_memory_unreadable", "the memory projection belongs to another owner; nothing imported")
    reports: dict[str, core_import.ImportReport] = {}
    for name, doc in DOCS.items():
        try:
            text = (source / name).read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        projected = set(manifest.get("digests", {}).get(doc, []))
        added = [e for e in core_import.parse_entries(text) if entry_digest(doc, e) not in projected]
        if added:
            reports[doc] = core_import.import_entries(owner_id, "\n§\n".join(added), doc=doc)
    log_event("release_memory_imported", imported=sum(len(r.imported) for r in reports.values()),
              already=sum(r.already for r in reports.values()))
    return reports

