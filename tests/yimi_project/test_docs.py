"""The docs are a map of the code, and the code cites only documents it carries.

- ``docs/architecture.md`` stays a map: at most 300 lines.
- Every name it and the decision records give under an app (``brain.services.finish_run``,
  ``memory.locks.lock_owner_calls``) imports and exists, and every repository path they give
  (``capabilities/mcp_host/sandbox.py``, ``docs/decisions/...``) is there.
- No file of the repository cites a document outside it (the old design notes lived beside
  the repository and are not shipped with a release), by name or by its section, plan and
  flow step numbers: a file states the rule itself or names the repository doc that does
  (flows by name, e.g. "flow F7" of ``docs/architecture.md``). Random seeds are not citations.

Read from the files of this checkout (a release's ``code/`` has no ``.git``), never ``./var``.
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(settings.BASE_DIR)
MAP = ROOT / "docs" / "architecture.md"
DECISIONS = ROOT / "docs" / "decisions"
MAP_MAX_LINES = 300
APPS = (
    "yimi_project", "accounts", "memory", "llm", "capabilities", "consent", "payments", "companion", "brain", "schedules",
    "voice", "workshop", "releases", "devices",
)
SKIPPED_DIRS = {".git", ".venv", "venv", "var", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache", ".hypothesis", ".pytest_cache"}
TEXT_SUFFIXES = {".py", ".md", ".toml", ".ini", ".cfg", ".txt", ".yaml", ".yml", ".json", ".sh", ".html"}
# Documents that are not in the repository. Spelled in pieces so this file does not cite them.
OUTSIDE = re.compile("|".join(re.escape(p) for p in ("CONVENTIONS" + ".md", "DESIGN" + ".md", "TECH-" + "NOTES", "../" + "shared")))
# Citations of the old product description: by its section and plan numbers, as the document ("the ..."),
# or by flow step numbers, which only it had. Bracketed characters keep this file from matching itself.
OUTSIDE_NUMBERED = re.compile(
    r"\bseed (?:\d|F\d|report\b|section\b)|\bseed[']s\b|\bthe[ ]seed\b|\bseed[:,][ ](?:report\b|[^\x00-\x7f])"
    r"|\bplan[ ]\d|\bF[1-7][ ]steps?[ ]\d|\(seed$",
    re.IGNORECASE,
)


def mapped_docs() -> list[Path]:
    return [MAP, *sorted(DECISIONS.glob("*.md"))]


def code_spans(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", text)]


def resolves(dotted: str) -> bool:
    """``app.module[.attr...]``: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_the_map_is_at_most_300_lines() -> None:
    lines = MAP.read_text(encoding="utf-8").count("\n")
    assert lines <= MAP_MAX_LINES, f"docs/architecture.md has {lines} lines; module detail goes in docstrings, decisions in docs/decisions/"


@pytest.mark.parametrize("doc", mapped_docs(), ids=lambda p: p.name)
def test_every_name_under_an_app_exists(doc: Path) -> None:
    names = {s.split("(")[0] for s in code_spans(doc) if re.fullmatch(rf"(?:{'|'.join(APPS)})(?:\.\w+)+(?:\(.*\))?", s)}
    missing = sorted(n for n in names if not resolves(n))
    assert not missing, f"{doc.relative_to(ROOT)} names what the code does not have: {missing}"


@pytest.mark.parametrize("doc", mapped_docs(), ids=lambda p: p.name)
def test_every_repository_path_exists(doc: Path) -> None:
    paths = {
        s for s in code_spans(doc)
        if "/" in s and " " not in s and re.fullmatch(r"[\w.-]+(?:/[\w.-]+)+/?", s) and s.split("/")[0] in {*APPS, "docs", "tests", "bench", "docker", "packs"}
    }
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"{doc.relative_to(ROOT)} names paths that are not in the repository: {missing}"


def repository_text_files() -> list[Path]:
    found = []
    for directory, subdirs, files in os.walk(ROOT):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS)
        here = Path(directory)
        in_docker = here.relative_to(ROOT).parts[:1] == ("docker",)
        found += [here / f for f in sorted(files) if Path(f).suffix in TEXT_SUFFIXES or in_docker]
    return found


def test_no_file_cites_a_document_outside_the_repository() -> None:
    citing = []
    for path in repository_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        citing += [
            f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(text.splitlines(), 1)
            if OUTSIDE.search(line) or OUTSIDE_NUMBERED.search(line)
        ]
    assert not citing, f"state the rule, or cite the repository's own docs instead (docs/architecture.md, docs/conventions.md, docs/decisions/): {citing}"
