"""The migration state of an instance installed before the restructure that moved models
between apps (issue 36): what the upgrade-in-place tests take a database back to."""

from __future__ import annotations

# Every app's leaf migration on main before the moves; the apps the restructure made
# (llm, companion, schedules, voice) did not exist yet.
BEFORE_RESTRUCTURE: list[tuple[str, str | None]] = [
    ("accounts", "0004_face_enrollment"),
    ("devices", "0009_push_to_talk_holds"),
    ("memory", "0011_cold_packs"),
    ("brain", "0017_watch_verbose_name_plural"),
    ("consent", "0001_initial"),
    ("payments", "0002_authorization_card_as_issued"),
    ("releases", "0002_watchdog_and_requests"),
    ("llm", None),
    ("companion", None),
    ("schedules", None),
    ("voice", None),
]
