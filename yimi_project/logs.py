"""Structured JSON logs through one helper, with redaction.

``log_event("run_failed", run_id=..., error_code=...)`` writes one line: JSON
(``JsonFormatter``) or ``key=value`` text (``TextFormatter``), as ``YIMI_LOG_FORMAT`` says.
Values of keys that look like secrets, prompts, content, tokens, paths or URLs are replaced by
``"[redacted]"``; in every other string value (nested in lists and dicts too), tokens and
secrets, URLs with credentials and paths in the data or secrets directory are redacted
(``yimi_project.leaks.redact_secrets``). Business logic never reads logs.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from yimi_project.leaks import redact_secrets

_REDACT = re.compile(r"secret|password|token|key|prompt|content|text|signature|path|url|nonce", re.I)
logger = logging.getLogger("yimi")


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return redact_secrets(value)
    if isinstance(value, dict):
        return {k: ("[redacted]" if isinstance(k, str) and _REDACT.search(k) else _scrub(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrub(v) for v in value]
    return value


def redact(fields: dict[str, Any]) -> dict[str, Any]:
    """Values of secret-like keys replaced; secrets inside every other string value scrubbed."""
    return {k: ("[redacted]" if _REDACT.search(k) else _scrub(v)) for k, v in fields.items()}


def log_event(event: str, level: int = logging.INFO, **fields: Any) -> None:
    logger.log(level, event, extra={"yimi_fields": redact(fields)})


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        body.update(getattr(record, "yimi_fields", {}))
        if record.exc_info:
            body["exc_type"] = record.exc_info[0].__name__ if record.exc_info[0] else None
        return json.dumps(body, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """The same events for a terminal: ``HH:MM:SS level event key=value ...``."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "yimi_fields", {})
        parts = [self.formatTime(record, "%H:%M:%S"), record.levelname.lower(), record.getMessage()]
        parts += [f"{k}={json.dumps(v, default=str, ensure_ascii=False) if not isinstance(v, str) or ' ' in v else v}" for k, v in fields.items()]
        if record.exc_info and record.exc_info[0]:
            parts.append(f"exc_type={record.exc_info[0].__name__}")
        return " ".join(parts)
