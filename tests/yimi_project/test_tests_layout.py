"""The tests mirror the apps: a test module lives in ``tests/<folder>/``, where the folder is an
app's name (``tests/memory/`` tests ``memory``), ``packs`` (the shipped packs of ``packs/``
themselves), ``yimi_project`` or ``e2e`` (tests that start the platform's real processes end to
end). Helper modules, fakes, servers and data are ``tests/support/``'s, which holds no test.
Only ``conftest.py`` (the shared fixtures) and ``__init__.py`` sit directly in ``tests/``.

Every folder with Python modules is a package (``__init__.py``), so two folders may hold modules
of the same name and a test imports a helper as ``tests.support.<module>``.

Read from the files of this checkout.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

TESTS = Path(settings.BASE_DIR) / "tests"
APPS = (
    "accounts", "memory", "capabilities", "consent", "payments", "brain", "llm", "companion", "schedules", "voice",
    "workshop", "releases", "devices",
)
TEST_FOLDERS = {*APPS, "packs", "yimi_project", "e2e"}
SUPPORT = "support"
TOP_LEVEL = {"conftest.py", "__init__.py"}
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".hypothesis"}


def modules_named_test(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("test_*.py") if not SKIPPED_DIRS & set(p.parts))


def misplaced_tests(root: Path) -> list[str]:
    """Test modules directly in ``root`` or under a first folder that is not one of ``TEST_FOLDERS``."""
    misplaced = []
    for path in modules_named_test(root):
        parts = path.relative_to(root).parts
        if len(parts) == 1 or parts[0] not in TEST_FOLDERS:
            misplaced.append(path.relative_to(root).as_posix())
    return misplaced


def test_no_test_module_sits_outside_a_folder_named_after_an_app_packs_yimi_project_or_e2e() -> None:
    misplaced = misplaced_tests(TESTS)
    assert not misplaced, (
        f"tests/ mirrors the apps: move {misplaced} into tests/<app>/ (or packs/, yimi_project/, e2e/); "
        "helpers go to tests/support/ and are not named test_*.py"
    )


def test_only_the_shared_fixtures_sit_directly_in_tests() -> None:
    loose = sorted(p.name for p in TESTS.glob("*.py") if p.name not in TOP_LEVEL)
    assert not loose, f"helper modules go to tests/support/, tests to tests/<app>/: {loose}"


def test_every_folder_of_modules_is_a_package() -> None:
    folders = {p.parent for p in TESTS.rglob("*.py") if not SKIPPED_DIRS & set(p.parts)}
    missing = sorted(f.relative_to(TESTS).as_posix() for f in folders if not (f / "__init__.py").exists())
    assert not missing, f"add an __init__.py to tests/ folders {missing}"


def test_the_rule_catches_a_test_at_the_top_in_support_and_in_an_unknown_folder(tmp_path: Path) -> None:
    for rel in ("memory/test_ok.py", "e2e/test_ok.py", "test_loose.py", "support/test_helper.py", "misc/test_stray.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert misplaced_tests(tmp_path) == ["misc/test_stray.py", "support/test_helper.py", "test_loose.py"]
