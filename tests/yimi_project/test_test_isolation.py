"""The test run never reads or writes the checkout's ``./var`` (the embedded default's data
directory): every path the settings derive from the data directory points elsewhere."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings


def _paths_in_settings() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for name in dir(settings):
        if not name.isupper():
            continue
        value = getattr(settings, name)
        if isinstance(value, Path):
            found[name] = value
    found["DATABASES.default.NAME"] = Path(str(settings.DATABASES["default"]["NAME"]))
    return found


def test_no_setting_points_into_the_checkouts_var() -> None:
    checkout_var = (Path(settings.BASE_DIR) / "var").resolve()
    paths = _paths_in_settings()
    assert "YIMI_WORKSPACE_DIR" in paths and "RAW_HOT_ROOT" in paths  # the scan sees derived paths
    inside = {name: str(p) for name, p in paths.items() if p.resolve().is_relative_to(checkout_var)}
    assert inside == {}
