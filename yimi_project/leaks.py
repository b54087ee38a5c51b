"""Internal markers that must never reach a device (or, for secrets, a log line).

Deterministic patterns, no model call. Two uses:

- ``find_markers`` / ``redact_markers``: every final text a device receives (main replies,
  follow-up reports, notices) — the reply checker removes a sentence that carries a marker
  (``capabilities.truth``), and template texts and notices have the markers redacted.
- ``redact_secrets``: log values (``yimi_project.logs``) — tokens and secrets, URLs with
  credentials and paths inside the data and secrets directories, wherever they appear in a
  string. Ids (run ids, call ids) stay in logs: they are how logs are read.

Marker kinds: ``uuid`` (run, task and call ids, dashed or as 32 hex digits), ``tool``
(pack tool names, ``pack__tool``), ``data_path`` (a path under ``settings.DATA_DIR`` or
``settings.SECRETS_DIR``), ``token`` (bearer tokens, ``sk-…`` keys, JWTs, Django-signed
capabilities, ``key=value`` secrets, long random strings), ``credential_url`` (a URL with
``user:password@``), ``stack`` (traceback lines, ``File "…", line N``, ``SomeError:``).
"""

from __future__ import annotations

import re
from functools import lru_cache

REDACTED = "[redacted]"

_STATIC: tuple[tuple[str, str], ...] = (
    ("credential_url", r"\b[a-z][a-z0-9+.-]*://[^\s/:@]+:[^\s/@]+@[^\s]*"),
    ("token", r"\bBearer\s+[A-Za-z0-9._~+/=-]{8,}"),
    ("token", r"\b(?:sk|pk|rk|ghp|gho|ghs|xox[abpr])[-_][A-Za-z0-9_-]{12,}"),
    ("token", r"\beyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}"),
    ("token", r"\.?eJ[A-Za-z0-9_-]{16,}(?::[A-Za-z0-9_-]+){1,2}"),
    ("token", r"(?i)\b(?:api[_-]?key|access[_-]?token|secret|password|passwd|token)\s*[=:]\s*\S+"),
    ("uuid", r"(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"),
    ("uuid", r"(?i)\b[0-9a-f]{32}\b"),
    ("token", r"\b(?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[G-Zg-z_])[A-Za-z0-9_-]{32,}\b"),  # not pure hex: ids
    ("tool", r"\b[A-Za-z][A-Za-z0-9-]*(?:_[A-Za-z0-9-]+)*__[A-Za-z0-9][A-Za-z0-9_-]*"),
    ("stack", r"Traceback \(most recent call last\)"),
    ("stack", r"\bFile \"[^\"]+\", line \d+"),
    ("stack", r"(?m)^\s*at [\w.$<>]+\([^)]*:\d+\)"),
    ("stack", r"\b[A-Z][A-Za-z0-9]*(?:Error|Exception)\b:"),
)
SECRET_KINDS = frozenset({"token", "credential_url", "data_path"})


def _directories() -> tuple[str, ...]:
    try:
        from django.conf import settings

        dirs = [str(getattr(settings, name, "") or "") for name in ("DATA_DIR", "SECRETS_DIR")]
    except Exception:  # noqa: BLE001 - settings not configured (a bare script): no directories to hide
        dirs = []
    return tuple(sorted({d.rstrip("/") for d in dirs if len(d.rstrip("/")) > 1}, key=len, reverse=True))


@lru_cache(maxsize=8)
def _compiled(directories: tuple[str, ...]) -> tuple[tuple[str, re.Pattern[str]], ...]:
    patterns = [(kind, re.compile(rx)) for kind, rx in _STATIC]
    for d in directories:  # the directory itself and anything under it, up to whitespace or a quote
        patterns.insert(0, ("data_path", re.compile(re.escape(d) + r"(?:/[^\s\"'，。；）)]*)?")))
    return tuple(patterns)


def _patterns() -> tuple[tuple[str, re.Pattern[str]], ...]:
    return _compiled(_directories())


def find_markers(text: str) -> list[str]:
    """The kinds of internal markers ``text`` carries, in pattern order, each once."""
    return [kind for kind, rx in dict.fromkeys(_patterns()) if rx.search(text)] if text else []


def redact_markers(text: str, kinds: frozenset[str] | None = None) -> str:
    """``text`` with every marker (of ``kinds``, default all) replaced by ``[redacted]``."""
    if not text:
        return text
    for kind, rx in _patterns():
        if kinds is None or kind in kinds:
            text = rx.sub(REDACTED, text)
    return text


def redact_secrets(text: str) -> str:
    """Tokens, credential URLs and data/secrets-directory paths redacted; ids kept."""
    return redact_markers(text, SECRET_KINDS)
