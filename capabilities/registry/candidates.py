"""Candidates: a pack handed to the registry, checked, and kept by its content digest.

``add_candidate`` is the one way in (the workshop's builds, ``manage.py pack check``).
The steps, in order:

1. the static checks on the directory as handed in (``checks.check_pack``); a refusal is
   stored with its findings and nothing is copied;
2. a copy of the regular files (opened with ``O_NOFOLLOW``) into an incoming directory of
   the registry, checked again, whose digest must equal the first one (the directory
   changed meanwhile → ``candidate_changed``);
3. the copy moves to ``<YIMI_PACK_REGISTRY_DIR>/store/<digest>/<name>/``: content-addressed
   and never written again, so what was checked is what gets published;
4. the honesty checks on that copy (``honesty.honesty_check``);
5. one ``PackCandidate`` row per digest, created or updated with both reports.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from capabilities.manifest import EXT
from capabilities.registry.checks import CheckReport, check_pack, directory_digest
from capabilities.registry.honesty import HonestyReport, honesty_check
from capabilities.registry_models import PackCandidate
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

DIGEST = re.compile(r"^[0-9a-f]{64}$")


def registry_dir() -> Path:
    return Path(settings.YIMI_PACK_REGISTRY_DIR)


def store_path(digest: str, name: str) -> Path:
    """Where the registry keeps a checked candidate: one directory per digest holding the
    pack's directory under its own name (the pack loader requires the name to match)."""
    return registry_dir() / "store" / digest / name


def add_candidate(
    directory: Path,
    *,
    origin: str,
    built_against: str | None,
    progress: Callable[[str], None] | None = None,
    honesty: Callable[[Path], HonestyReport] = honesty_check,
) -> PackCandidate:
    """Hand a candidate pack to the registry: the public entry point for the workshop.

    ``directory`` is the built pack (plugin.json, mcp.json, skills/<name>/SKILL.md,
    server/, fake/, tests/contract.yaml, scripts/test.py). ``origin`` is ``"workshop"``
    (Yimi built it) or ``"operator"``. ``built_against`` is the content digest of the
    online version the build started from (``registry.online_digest(name)`` at that
    time), or None for a new pack; publishing refuses with ``online_version_changed`` if
    the online version is another one by then.

    Runs the static checks, copies the pack into the registry's store, runs the honesty
    checks there (minutes: two sandboxed, traced contract runs) and stores the result:
    the returned candidate's ``state`` is ``passed`` or ``refused``, its
    ``static_report`` and ``honesty_report`` say why (rule codes and file names, never
    file contents), ``digest`` identifies it for ``publish``. ``progress`` gets a line
    per long step; ``honesty`` is the honesty check to run (tests reuse one real result
    per digest). Raises ``YimiError``
    (``invalid_request``) only for bad arguments; a bad pack is a refused candidate.
    """
    say = progress or (lambda _line: None)
    if origin not in PackCandidate.Origin.values:
        raise YimiError("invalid_request", f"origin must be one of {', '.join(PackCandidate.Origin.values)}")
    if built_against is not None and not DIGEST.match(built_against):
        raise YimiError("invalid_request", "built_against must be a content digest (64 hex digits) or None")
    say("static checks")
    report = check_pack(Path(directory), origin=origin)
    raw_name = report.manifest.get("name")
    name = raw_name if isinstance(raw_name, str) else ""
    path = ""
    honesty_result: dict = {}
    if report.passed:
        say(f"copying {len(report.files)} files into the registry")
        copied = _store(Path(directory), report, name)
        if copied is None:
            report.add("candidate_changed", "", "the directory changed while it was being checked")
        else:
            path = str(copied)
            say("honesty checks: contract against the fake and the real implementation, traced in the sandbox")
            honesty_result = honesty(copied).as_json()
    state = PackCandidate.State.PASSED if report.passed and honesty_result.get("passed") else PackCandidate.State.REFUSED
    ext = report.manifest.get("extensions", {}).get(EXT, {}) if isinstance(report.manifest.get("extensions"), dict) else {}
    candidate, _ = PackCandidate.objects.update_or_create(
        digest=report.digest,
        defaults={
            "name": name[:64],
            "version": str(report.manifest.get("version", ""))[:32],
            "maintainer": str(ext.get("maintainer", "") if isinstance(ext, dict) else "")[:16],
            "origin": origin,
            "built_against": built_against or "",
            "state": state,
            "path": path,
            "manifest": report.manifest if report.passed else {},
            "files": [[f.path, f.size, f.sha256] for f in report.files],
            "static_report": report.as_json(),
            "honesty_report": honesty_result,
            "checked_at": timezone.now(),
        },
    )
    log_event("pack_candidate_checked", pack=name, digest=candidate.digest[:12], state=state, codes=report.codes)
    say(f"candidate {candidate.digest[:12]}: {state}")
    return candidate


def _store(source: Path, report: CheckReport, name: str) -> Path | None:
    """Copy the checked regular files into the store; None if the copy is not what was checked."""
    incoming = registry_dir() / "incoming" / uuid.uuid4().hex
    target = incoming / name
    try:
        for item in report.files:
            destination = target / item.path
            destination.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            fd = os.open(source / item.path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as src, open(destination, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.chmod(destination, 0o644)
        again = check_pack(target, origin="operator")
        if again.digest != report.digest:
            return None
        final = store_path(report.digest, name)
        if not final.exists():
            final.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            os.replace(target, final)
        return final
    except OSError:
        return None
    finally:
        shutil.rmtree(incoming, ignore_errors=True)


def verify_stored(candidate: PackCandidate) -> bool:
    """Whether the store still holds exactly what was checked (same digest)."""
    path = Path(candidate.path) if candidate.path else None
    return path is not None and path.is_dir() and directory_digest(path) == candidate.digest
