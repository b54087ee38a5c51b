"""The docs are a map of the code, and the code cites only documents it carries.

- ``docs/architecture.md`` stays a map: at most 300 lines.
- The docs that name code (``docs/*.md``, ``docs/decisions/*.md``, ``README.md``,
  ``docker/README.md``) name what is there today. In their code spans (text in backticks,
  outside fenced blocks) every name under an app (``brain.services.finish_run``) resolves,
  and every repository path (``capabilities/mcp_host/sandbox.py``, ``docs/decisions/...``)
  exists. A name under an app resolves when it imports (module, then attributes), or is a
  model label (``accounts.VoiceCall``), or is a string the apps' code spells in quotes: a
  Celery task name (``memory.tasks.regenerate_projections``, which persists in queued
  messages), a frame type (``voice.started``), a check id (``memory.W001``). A value quoted
  inside the span (``"memory.ambient_log"``) is a value, not checked. A path the operator
  makes (``docker/.env``, ``docker/secrets/``: anchored entries of a ``.gitignore`` beside
  it) is not looked for.
- Outside code spans the pages and the READMEs (not the decision records) are checked too:
  a path under an app, ``docs/``, ``tests/``, ``bench/``, ``docker/`` or ``packs/`` in plain
  text must exist, so an old path cannot hide by losing its backticks.
- Decision records keep their history: what no longer exists is named in plain text, in a
  sentence that says it is history; anything in backticks is today's name, checked as above.
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
from django.apps import apps
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


PATH_ROOTS = {*APPS, "docs", "tests", "bench", "docker", "packs"}
# A path in running text: a first folder from PATH_ROOTS, then at least one more part.
PLAIN_PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(sorted(PATH_ROOTS))})/[\w./-]*[\w/])")


def pages() -> list[Path]:
    """The docs that describe the code as it is: the map, the other pages, the READMEs."""
    return [MAP, *sorted(p for p in (ROOT / "docs").glob("*.md") if p != MAP), ROOT / "README.md", ROOT / "docker" / "README.md"]


def mapped_docs() -> list[Path]:
    return [*pages(), *sorted(DECISIONS.glob("*.md"))]


def code_spans(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", text)]


def imports(dotted: str) -> bool:
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


def is_model_label(dotted: str) -> bool:
    try:
        apps.get_model(dotted)
    except (LookupError, ValueError):
        return False
    return True


_spelled: set[str] | None = None


def spelled_in_code(dotted: str) -> bool:
    """Whether the apps' Python source has ``dotted`` as a quoted string."""
    global _spelled
    if _spelled is None:
        _spelled = set()
        for app in APPS:
            for path in (ROOT / app).rglob("*.py"):
                _spelled.update(re.findall(r"""["']((?:[A-Za-z_]\w*\.)+[\w]+)["']""", path.read_text(encoding="utf-8")))
    return dotted in _spelled


def resolves(dotted: str) -> bool:
    return imports(dotted) or is_model_label(dotted) or spelled_in_code(dotted)


def operator_made(path: str) -> bool:
    """A path an anchored entry (``/.env``, ``/secrets/``) of a ``.gitignore`` on its way
    ignores: the operator makes it, the repository never holds it."""
    parts = path.rstrip("/").split("/")
    for depth in range(len(parts)):
        ignore = ROOT.joinpath(*parts[:depth], ".gitignore")
        if not ignore.is_file():
            continue
        rest = "/".join(parts[depth:])
        for line in ignore.read_text(encoding="utf-8").splitlines():
            entry = line.strip().rstrip("/")
            if entry.startswith("/") and (rest == entry[1:] or rest.startswith(entry[1:] + "/")):
                return True
    return False


def missing_paths(paths: set[str]) -> list[str]:
    return sorted(p for p in paths if not (ROOT / p).exists() and not operator_made(p))


def test_the_map_is_at_most_300_lines() -> None:
    lines = MAP.read_text(encoding="utf-8").count("\n")
    assert lines <= MAP_MAX_LINES, f"docs/architecture.md has {lines} lines; module detail goes in docstrings, decisions in docs/decisions/"


@pytest.mark.parametrize("doc", mapped_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_under_an_app_exists(doc: Path) -> None:
    names = {s.split("(")[0] for s in code_spans(doc) if re.fullmatch(rf"(?:{'|'.join(APPS)})(?:\.\w+)+(?:\(.*\))?", s)}
    missing = sorted(n for n in names if not resolves(n))
    assert not missing, f"{doc.relative_to(ROOT)} names what the code does not have: {missing}"


@pytest.mark.parametrize("doc", mapped_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_exists(doc: Path) -> None:
    paths = {
        s for s in code_spans(doc)
        if "/" in s and " " not in s and re.fullmatch(r"[\w.-]+(?:/[\w.-]+)+/?", s) and s.split("/")[0] in PATH_ROOTS
    }
    missing = missing_paths(paths)
    assert not missing, f"{doc.relative_to(ROOT)} names paths that are not in the repository: {missing}"


@pytest.mark.parametrize("doc", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_in_a_pages_text_exists(doc: Path) -> None:
    paths = {m.rstrip(".") for m in PLAIN_PATH.findall(doc.read_text(encoding="utf-8")) if not re.search(r"[*{}<>]", m)}
    missing = missing_paths(paths)
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
