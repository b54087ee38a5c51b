"""Units, and the numbers a text states with the unit next to each.

``units_compatible`` says when two unit spellings mean the same (``UNIT_SYNONYMS``, or a
bare count against a countable unit). ``_numbers`` reads a text (after
``chinese_to_arabic``) into numbers with their units; ``_loose_numbers`` collects every
number spelled anywhere in a text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from capabilities.truth.numerals import _convert, chinese_to_arabic

# ---------------------------------------------------------------------------------------
# Units
# ---------------------------------------------------------------------------------------

# Canonical unit -> spellings that mean it. A leading 个 is ignored (个文件 = 文件).
UNIT_SYNONYMS: dict[str, tuple[str, ...]] = {
    "byte": ("byte", "bytes", "b", "字节"),
    "kilobyte": ("kb", "kib", "千字节"),
    "megabyte": ("mb", "mib", "兆字节", "兆"),
    "gigabyte": ("gb", "gib"),
    "file": ("file", "files", "文件", "份文件"),
    "item": ("item", "items", "项", "条目"),
    "message": ("message", "messages", "msg", "消息", "条消息"),
    "email": ("email", "emails", "邮件", "封邮件", "封"),
    "reminder": ("reminder", "reminders", "提醒", "条提醒"),
    "person": ("person", "persons", "people", "人", "位", "联系人"),
    "page": ("page", "pages", "页"),
    "line": ("line", "lines", "行"),
    "character": ("character", "characters", "char", "chars", "字符", "字"),
    "count": ("个", "count", "pcs", "piece", "pieces", "件"),
    "times": ("time", "times", "次", "遍"),
    "cny": ("元", "yuan", "cny", "rmb", "块", "块钱", "人民币"),
    "usd": ("usd", "美元", "dollar", "dollars"),
    "celsius": ("°c", "℃", "度", "摄氏度", "celsius"),
    "percent": ("%", "percent", "百分比"),
    "second": ("second", "seconds", "sec", "secs", "s", "秒", "秒钟"),
    "minute": ("minute", "minutes", "min", "mins", "分钟"),
    "hour": ("hour", "hours", "hr", "hrs", "h", "小时"),
    "day": ("day", "days", "天"),
    "kilometer": ("km", "公里", "千米"),
    "meter": ("meter", "meters", "m", "米"),
    "kilogram": ("kg", "公斤", "千克"),
    "gram": ("gram", "grams", "g", "克"),
}
# Units a bare count ("3个") is compatible with.
COUNTABLE = {"file", "item", "message", "email", "reminder", "person", "page", "line", "character", "count"}
_UNIT_INDEX = {spelling: canon for canon, spellings in UNIT_SYNONYMS.items() for spelling in spellings}
# Classifiers recognized after a number even when no receipt uses them (they then only
# match a receipt unit spelled the same way).
_CLASSIFIERS = "只条张位份本台部首篇步句段种类岁年月日号周点"


def canonical_unit(unit: str) -> str:
    """The canonical name of a unit spelling (unknown spellings stand for themselves)."""
    s = unit.strip().lower()
    if s.startswith("个") and len(s) > 1:
        s = s[1:]
    if s in _UNIT_INDEX:
        return _UNIT_INDEX[s]
    if s.endswith("s") and s[:-1] in _UNIT_INDEX:
        return _UNIT_INDEX[s[:-1]]
    return s


def units_compatible(a: str, b: str) -> bool:
    """Same spelling, synonyms (byte/字节/B, file/个文件, 元/CNY, °C/度, …), or a bare
    count (个) against a countable unit."""
    ca, cb = canonical_unit(a), canonical_unit(b)
    if ca == cb:
        return True
    return ("count" in (ca, cb)) and (ca in COUNTABLE and cb in COUNTABLE)


# ---------------------------------------------------------------------------------------
# Numbers in text
# ---------------------------------------------------------------------------------------

_NUMBER_RE = re.compile(r"(?<![A-Za-z0-9_.])(\d{1,3}(?:,\d{3})+(?!\d)|\d+)(\.\d+)?")


@dataclass(frozen=True)
class _Number:
    value: float
    unit: str | None
    bare_one: bool


def _unit_after(text: str, pos: int, known: list[str]) -> str | None:
    j = pos
    while j < len(text) and text[j] in " \t":
        j += 1
    ge = 1 if text.startswith("个", j) else 0
    low = text.lower()
    for unit in known:
        start = j + ge
        if not low.startswith(unit, start):
            continue
        end = start + len(unit)
        if unit[-1].isascii() and unit[-1].isalpha():
            if low.startswith("es", end) and not (end + 2 < len(low) and low[end + 2].isalpha()):
                end += 2
            elif low.startswith("s", end) and not (end + 1 < len(low) and low[end + 1].isalpha()):
                end += 1
            if end < len(low) and low[end].isascii() and low[end].isalpha():
                continue
        return text[start:end]
    if ge:
        return "个"
    if j < len(text) and text[j] in _CLASSIFIERS:
        return text[j]
    return None


def _numbers(text: str, known_units: list[str]) -> list[_Number]:
    """Numbers (after Chinese numeral conversion) with their adjacent unit, if any.

    Ordinals (第3) are skipped; a number glued to a preceding letter (S3, v2) is part of a
    name and skipped too.
    """
    converted, bare = _convert(text)
    found: list[_Number] = []
    for m in _NUMBER_RE.finditer(converted):
        start = m.start()
        if start > 0 and converted[start - 1] == "第":
            continue
        value = float(m.group(1).replace(",", "") + (m.group(2) or ""))
        if start > 0 and converted[start - 1] in "-−" and (start == 1 or not converted[start - 2].isalnum()):
            value = -value
        found.append(_Number(value, _unit_after(converted, m.end(), known_units), start in bare and not m.group(2)))
    return found


def _loose_numbers(text: str) -> set[float]:
    """Every number spelled anywhere in a text (generous: used for what is allowed)."""
    converted = chinese_to_arabic(text)
    out: set[float] = set()
    for m in re.finditer(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?", converted):
        for s in {m.group(), m.group().replace(",", "")} | set(m.group().split(",")):
            try:
                out.add(float(s))
                out.add(-float(s))
            except ValueError:
                pass
    return out


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
