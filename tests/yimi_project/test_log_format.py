"""One log format per output: YIMI_LOG_FORMAT picks text or JSON, and each event is
printed once (the "yimi" logger does not propagate to the root handler daphne installs)."""

from __future__ import annotations

import io
import json
import logging

from django.conf import settings

from yimi_project.logs import JsonFormatter, TextFormatter, log_event


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_each_event_is_printed_once_in_the_configured_format() -> None:
    assert settings.LOGGING["handlers"]["console"]["formatter"] == settings.YIMI_LOG_FORMAT
    root, collect = logging.getLogger(), Collect()
    root.addHandler(collect)  # what daphne's logging.basicConfig adds
    yimi = logging.getLogger("yimi")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter())
    yimi.addHandler(handler)
    try:
        log_event("run_failed", run_id="r1", error_code="timeout")
    finally:
        root.removeHandler(collect)
        yimi.removeHandler(handler)
    assert collect.records == []
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert lines[0].endswith("info run_failed run_id=r1 error_code=timeout")


def test_json_format_is_one_json_object_per_event() -> None:
    record = logging.LogRecord("yimi", logging.WARNING, __file__, 1, "pack_crashed", None, None)
    record.yimi_fields = {"pack": "shop", "url": "[redacted]"}
    body = json.loads(JsonFormatter().format(record))
    assert (body["event"], body["level"], body["pack"]) == ("pack_crashed", "warning", "shop")
    text = TextFormatter().format(record)
    assert "\n" not in text and "pack=shop" in text and not text.startswith("{")
