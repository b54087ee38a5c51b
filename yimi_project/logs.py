"""Structured JSON logs through one helper, with redaction.

``log_event("run_failed", run_id=..., error_code=...)`` writes one JSON line. Values of
keys that look like secrets, prompts, content, tokens, paths or URLs are replaced by
``"[redacted]"``; business logic never reads logs.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

_REDACT = re.compile(r"secret|password|token|key|prompt|content|text|signature|path|url|nonce", re.I)
logger = logging.getLogger("yimi")


def redact(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: ("[redacted]" if _REDACT.search(k) else v) for k, v in fields.items()}


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
