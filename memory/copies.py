"""Copies of memory payloads that other apps keep, and their redaction when forgetting (F7).

A payload committed through the memory pack passes through the capability gateway (the
ledger keeps the tool's arguments and results), can sit in a consent card's preview, and
can be quoted in a sub-agent's goal. Forgetting erases the payload in memory itself and
asks every app that may hold a copy to redact it in its own tables: each app owns its
tables, and memory sits below those apps (they import memory, never the reverse), so each
registers its redactor here when Django starts (``AppConfig.ready``) and ``forget`` calls
them all inside its transaction. A redactor that fails rolls the forget back.

What counts as a copy (``ForgottenContent``), for any JSON value or text a redactor holds:

- a JSON value (object, array or string) equal to a forgotten payload is replaced whole
  by ``REDACTED``;
- the payload's text — its ``text`` (the usual ``{"text": ...}``), the payload itself when
  it is a string, every other string in it of at least ``LONG_STRING`` characters, and its
  compact JSON (a preview made of the arguments holds that) — is replaced wherever a
  string contains it, if it is at least ``MIN_TEXT`` characters long; a shorter text is
  replaced only where it is the whole string (two characters are a word, not a copy);
- a string that ends with the first ``MIN_CUT`` or more characters of such a text (a copy
  cut at a length limit, like a card preview) loses that tail.

Object keys are treated like strings. Numbers and booleans are never matched on their own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

REDACTED = "[forgotten]"
MIN_TEXT = 4
LONG_STRING = 8
MIN_CUT = 12


def _canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _texts(payload: Any) -> set[str]:
    """The texts of one payload that a copy may hold (see the module docstring)."""
    texts: set[str] = set()
    if isinstance(payload, str):
        texts.add(payload)
    if isinstance(payload, dict) and isinstance(payload.get("text"), str):
        texts.add(payload["text"])
    texts.update(s for s in _strings(payload) if len(s.strip()) >= LONG_STRING)
    if isinstance(payload, (dict, list)):
        texts.add(_canonical(payload))
    out: set[str] = set()
    for text in texts:
        if not text.strip():
            continue
        out.add(text)
        # as it appears inside JSON text (quotes, backslashes, newlines escaped)
        out.add(json.dumps(text, ensure_ascii=False)[1:-1])
        out.add(json.dumps(text)[1:-1])
    return out


@dataclass
class ForgottenContent:
    """The payloads a forget erases, and the matching rules for their copies."""

    payloads: list[Any]
    _values: set[str] = field(init=False, repr=False)
    _whole: set[str] = field(init=False, repr=False)
    # first MIN_TEXT characters → the texts found inside strings; first MIN_CUT → cut-off tails
    _inside: dict[str, list[str]] = field(init=False, repr=False)
    _heads: dict[str, list[str]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._values = {_canonical(p) for p in self.payloads if isinstance(p, (dict, list, str))}
        texts: set[str] = set()
        for payload in self.payloads:
            texts |= _texts(payload)
        self._whole = {t.strip() for t in texts}
        self._inside, self._heads = {}, {}
        for text in texts:
            if len(text.strip()) >= MIN_TEXT:
                self._inside.setdefault(text[:MIN_TEXT], []).append(text)
            if len(text) > MIN_CUT:
                self._heads.setdefault(text[:MIN_CUT], []).append(text)

    def __bool__(self) -> bool:
        return bool(self._values or self._whole)

    def redact_text(self, text: str) -> str:
        """``text`` with every copy of a forgotten payload's text replaced."""
        if not text:
            return text
        if text in self._values or text.strip() in self._whole:
            return REDACTED
        found = _starts(text, self._inside)
        if found:
            texts = sorted({t for head in found for t in self._inside[head]}, key=len, reverse=True)
            text = re.sub("|".join(re.escape(t) for t in texts), REDACTED, text)
        return self._cut_tail(text)

    def _cut_tail(self, text: str) -> str:
        for head in sorted(_starts(text, self._heads), key=text.find):
            start = text.find(head)
            while start != -1:
                if any(full.startswith(text[start:]) for full in self._heads[head]):
                    return text[:start] + REDACTED
                start = text.find(head, start + 1)
        return text

    def redact(self, value: Any) -> Any:
        """``value`` (any JSON value) with every copy of a forgotten payload replaced."""
        if isinstance(value, (dict, list, str)) and _canonical(value) in self._values:
            return REDACTED
        if isinstance(value, str):
            return self.redact_text(value)
        if isinstance(value, dict):
            return {self.redact_text(k) if isinstance(k, str) else k: self.redact(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.redact(v) for v in value]
        return value


def rows_in_chunks(queryset: Any, size: int = 500) -> Iterator[list[Any]]:
    """The rows of ``queryset`` in primary-key order, ``size`` at a time (keyset paging),
    each chunk read completely before the caller writes: SQLite has no isolation between
    an open cursor and updates on the same connection."""
    last = None
    while True:
        page = queryset.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        rows = list(page[:size])
        if not rows:
            return
        yield rows
        last = rows[-1].pk


def redacted_text(content: ForgottenContent, text: str, max_length: int) -> str:
    """``text`` redacted and kept within its column's length (the marker can be longer
    than a short copy it replaces)."""
    return content.redact_text(text)[:max_length]


def _starts(text: str, index: dict[str, list[str]]) -> set[str]:
    """The keys of ``index`` (all of one length) that occur in ``text``: one pass over its
    substrings of that length, however many texts are indexed."""
    if not index:
        return set()
    size = len(next(iter(index)))
    return {text[i : i + size] for i in range(len(text) - size + 1)} & index.keys()


# A redactor gets (owner id, what was forgotten) and returns {place: rows changed}.
Redactor = Callable[[int, ForgottenContent], dict[str, int]]
_REDACTORS: dict[str, Redactor] = {}
_MODELS: dict[str, tuple[str, ...]] = {}


def register(app: str, redactor: Redactor, *, models: Iterable[str] = ()) -> None:
    """Called from an app's ``AppConfig.ready``: ``redactor`` redacts copies in ``app``'s
    tables, those of ``models`` (labels, ``"app.Model"``), which ``manage.py
    forget_compact`` rewrites so the redacted bytes leave their files
    (``memory.assertions.forget_compaction``)."""
    _REDACTORS[app] = redactor
    _MODELS[app] = tuple(models)


def redactors() -> dict[str, Redactor]:
    return dict(_REDACTORS)


def copy_models() -> dict[str, tuple[str, ...]]:
    """The models each registered app keeps copies in (``register``'s ``models``)."""
    return dict(_MODELS)


def redact_copies(owner_id: int, content: ForgottenContent) -> dict[str, int]:
    """Ask every registered app to redact its copies; returns ``{"app.place": rows}`` with
    every place each app looked in (0 when it held no copy). Nothing is asked when nothing
    was erased."""
    if not content:
        return {}
    counts: dict[str, int] = {}
    for app, redactor in sorted(_REDACTORS.items()):
        for place, rows in redactor(owner_id, content).items():
            counts[f"{app}.{place}"] = rows
    return counts
