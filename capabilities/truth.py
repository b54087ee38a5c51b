"""Facts are said by the system: fixed-template facts and a deterministic reply checker.

A tool call's receipt (``contracts/receipt.v1.schema.json``, normalized by
``capabilities.receipts``) carries facts of six kinds:

``status``    what happened to the call (one of the nine receipt statuses);
``effects``   what was changed where, and how sure we are (verification);
``values``    named numbers/strings with a unit and a source (the receipt's ``content`` is
              the material the model talks about; it is not restated as a fact, but numbers
              inside it may be quoted);
``unknowns``  what is not known;
``next``      whether the call may run again (retry permission, check_with, waiting_on);
``diff``      new vs old: which facts the owner has not been told yet. It is computed here
              by the platform from ACKed deliveries (``render_diff``), never by a pack.

Rules (all deterministic, no model call anywhere in this module):

1. Status and numbers are rendered from the fixed templates in ``TEMPLATES`` (one small
   table, keyed by fact kind and variant, never by tool). Each template has a text version
   and a shorter voice version. The only tool-specific part is the ``tool_label`` slot.
2. A fact's id is stable: ``sha256(key, kind, canonical content)[:16]``. ``key`` names the
   call (task id / call id), so the same fact of the same call always has the same id and
   equal facts of two calls have different ids.
3. ``check_reply`` takes the model's reply (content and tone only) and removes every
   sentence that disagrees with the receipts: numbers not in the receipts, status words the
   receipts do not back, "noted" without a verified owner_data/workspace effect,
   suggestions to redo a ``retry: forbidden`` call that succeeded, and restatements of facts
   already delivered. It then appends, from the templates, every undelivered fact the
   remaining text does not state.
4. ``activity_card`` shows the receipt's status as it is, including ``unknown`` and
   ``waiting``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

FACT_KINDS = ("status", "effects", "values", "unknowns", "next", "diff")
STATUSES = ("succeeded", "partial", "failed", "unknown", "waiting", "running", "queued", "cancelled", "rejected")
VERIFICATIONS = ("verified", "service_ack", "not_verified", "unknown")

# ---------------------------------------------------------------------------------------
# The template table: the only place where fact sentences are worded.
# Key "kind.variant" -> (text, voice). Slots: tool_label, verb, target, name, value, unit,
# item, check_with. Every text ends with a sentence mark so facts can be concatenated.
# ---------------------------------------------------------------------------------------
TEMPLATES: dict[str, tuple[str, str]] = {
    "status.succeeded": ("「{tool_label}」已完成。", "办好了。"),
    "status.partial": ("「{tool_label}」只完成了一部分。", "只办好了一部分。"),
    "status.failed": ("「{tool_label}」没有成功。", "没办成。"),
    "status.unknown": ("「{tool_label}」结果还不清楚，要先核查。", "结果还不清楚。"),
    "status.waiting": ("「{tool_label}」在等你确认，本次未执行。", "在等你确认。"),
    "status.running": ("「{tool_label}」还在办。", "还在办。"),
    "status.queued": ("「{tool_label}」排上队了，还在办。", "还在办。"),
    "status.cancelled": ("「{tool_label}」已取消，没有执行。", "已取消。"),
    "status.rejected": ("「{tool_label}」被拦下了，没有执行。", "没有执行。"),
    "effects.verified": ("已{verb} {target}，已核实。", "已{verb}{target}。"),
    "effects.service_ack": ("已{verb} {target}，对方已确认收到。", "已{verb}{target}。"),
    "effects.not_verified": ("{verb} {target} 还没有核实。", "{target}还没核实。"),
    "effects.unknown": ("不清楚 {target} 是否已{verb}。", "{target}情况不明。"),
    "values.number": ("{name}：{value} {unit}。", "{name}{value}{unit}。"),
    "values.text": ("{name}：{value}。", "{name}{value}。"),
    "unknowns.item": ("还不清楚：{item}。", "不清楚{item}。"),
    "next.forbidden_done": ("这项操作已经成功，不要重复。", "不要重复。"),
    "next.forbidden": ("「{tool_label}」不能重试。", "不能重试。"),
    "next.after_check": ("重试前要先核查结果。", "要先核查。"),
    "next.after_check_with": ("重试前要先用「{check_with}」核查。", "要先核查。"),
    "next.allowed_after_failure": ("「{tool_label}」可以再试一次。", "可以再试。"),
    "next.waiting_owner": ("要等你确认后才会执行。", "等你确认。"),
    "next.waiting_service": ("在等对方服务回应。", "在等对方回应。"),
}

# Verbs for effect actions (the action is a pack-declared word; unknown ones are shown as is).
ACTION_VERBS: dict[str, str] = {
    "write": "写入",
    "create": "创建",
    "update": "更新",
    "append": "追加",
    "delete": "删除",
    "remove": "删除",
    "send": "发送",
    "move": "移动",
    "rename": "重命名",
    "read": "读取",
    "schedule": "安排",
    "cancel": "取消",
    "pay": "支付",
    "book": "预订",
    "save": "保存",
}


@dataclass(frozen=True)
class Fact:
    """One fact, rendered from a fixed template.

    ``id`` is ``sha256(key, kind, canonical content)`` in hex, first 16 characters.
    ``text`` is the written version, ``voice`` the shorter spoken one. The remaining
    fields are the structured data the checker compares against (``number``/``unit`` for
    numeric values, ``status`` for status facts, ``target``/``verification`` for effects).
    """

    id: str
    kind: str
    text: str
    voice: str
    key: str
    template: str
    status: str | None = None
    name: str | None = None
    value: Any = None
    number: float | None = None
    unit: str | None = None
    target: str | None = None
    action: str | None = None
    verification: str | None = None
    category: str | None = None
    retry: str | None = None


@dataclass
class CheckResult:
    """What ``check_reply`` made of a reply.

    ``text``: the final text; ``removed``: (sentence, reason) pairs; ``added``: facts appended
    from templates; ``told``: ids of the facts the final text carries (stated by kept
    sentences, or added), in the order of the ``facts`` argument.
    """

    text: str
    removed: list[tuple[str, str]] = field(default_factory=list)
    added: list[Fact] = field(default_factory=list)
    told: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------


def fact_id(key: str, kind: str, content: dict[str, Any]) -> str:
    """Stable id: sha256 of call key + kind + canonical JSON content, hex[:16]."""
    canonical = json.dumps(content, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(f"{key}\x1f{kind}\x1f{canonical}".encode()).hexdigest()[:16]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def format_number(value: Any) -> str:
    """12 → "12", 12.0 → "12", 1.50 → "1.5" (no grouping, no exponent)."""
    try:
        d = Decimal(str(value))
    except InvalidOperation:
        return str(value)
    if d == d.to_integral_value():
        return str(int(d))
    return format(d.normalize(), "f")


def _make(key: str, kind: str, template: str, content: dict[str, Any], slots: dict[str, Any], **data: Any) -> Fact:
    text, voice = TEMPLATES[template]
    return Fact(
        id=fact_id(key, kind, {"template": template, **content}),
        kind=kind,
        text=text.format(**slots),
        voice=voice.format(**slots),
        key=key,
        template=template,
        **data,
    )


def render_facts(receipt: dict[str, Any], *, tool_label: str, key: str) -> list[Fact]:
    """Render a (normalized) receipt into facts, from the fixed per-kind templates.

    Order: status, effects, values, unknowns, next. A numeric value without a unit is not
    stated (receipt rule 3). ``content`` is not restated: the model writes about it. The
    ``diff`` kind is not rendered here, see ``render_diff``. Equal facts are kept once.
    """
    facts: list[Fact] = []
    status = receipt.get("status")
    if status not in STATUSES:
        status = "unknown"
    label = {"tool_label": tool_label}
    facts.append(_make(key, "status", f"status.{status}", {"status": status}, label, status=status))

    for eff in receipt.get("effects") or []:
        verification = eff.get("verification") if eff.get("verification") in VERIFICATIONS else "unknown"
        action = str(eff.get("action", ""))
        target = str(eff.get("target", ""))
        verb = ACTION_VERBS.get(action.lower(), action)
        facts.append(
            _make(
                key,
                "effects",
                f"effects.{verification}",
                {"target": target, "action": action, "verification": verification},
                {**label, "verb": verb, "target": target},
                status=status,
                target=target,
                action=action,
                verification=verification,
                category=eff.get("category"),
            )
        )

    for item in receipt.get("values") or []:
        name, value, unit = str(item.get("name", "")), item.get("value"), item.get("unit")
        if _is_number(value):
            if not unit:
                continue
            shown = format_number(value)
            facts.append(
                _make(key, "values", "values.number", {"name": name, "value": shown, "unit": unit},
                      {**label, "name": name, "value": shown, "unit": unit},
                      name=name, value=value, number=float(value), unit=unit)
            )
        else:
            shown = ("是" if value else "否") if isinstance(value, bool) else str(value)
            facts.append(
                _make(key, "values", "values.text", {"name": name, "value": shown},
                      {**label, "name": name, "value": shown}, name=name, value=value)
            )

    for unknown in receipt.get("unknowns") or []:
        facts.append(_make(key, "unknowns", "unknowns.item", {"item": str(unknown)}, {**label, "item": str(unknown)}))

    nxt = receipt.get("next") or {}
    retry, check_with, waiting_on = nxt.get("retry"), nxt.get("check_with"), nxt.get("waiting_on")
    variants: list[str] = []
    if retry == "forbidden":
        variants.append("next.forbidden_done" if status == "succeeded" else "next.forbidden")
    elif retry == "after_check":
        variants.append("next.after_check_with" if check_with else "next.after_check")
    elif retry == "allowed" and status == "failed":
        variants.append("next.allowed_after_failure")
    if waiting_on == "owner" and status != "waiting":
        variants.append("next.waiting_owner")
    elif waiting_on == "service":
        variants.append("next.waiting_service")
    for variant in variants:
        facts.append(
            _make(key, "next", variant, {"retry": retry, "check_with": check_with, "waiting_on": waiting_on, "status": status},
                  {**label, "check_with": check_with or ""}, status=status, retry=retry)
        )

    seen: set[str] = set()
    unique = []
    for fact in facts:
        if fact.id not in seen:
            seen.add(fact.id)
            unique.append(fact)
    return unique


def render_diff(new_facts: Iterable[Fact], delivered_ids: set[str] | frozenset[str]) -> list[Fact]:
    """The ``diff`` kind: of ``new_facts``, those whose id was not yet delivered.

    A fact counts as delivered only when the reply that carried it was ACKed
    (rendered/played); the caller passes the ids of those facts. Facts keep their ids so
    the next ACK can mark them delivered. Order is kept, duplicates dropped.
    """
    out: list[Fact] = []
    seen: set[str] = set()
    for fact in new_facts:
        if fact.id in delivered_ids or fact.id in seen:
            continue
        seen.add(fact.id)
        out.append(fact)
    return out


def activity_card(task_id: str, title: str, receipt: dict[str, Any]) -> dict[str, Any]:
    """An activity card. Its status is the receipt's status as is (unknown, waiting, …)."""
    status = receipt.get("status") if receipt.get("status") in STATUSES else "unknown"
    return {
        "task_id": task_id,
        "title": title,
        "status": status,
        "facts": [f.text for f in render_facts(receipt, tool_label=title, key=task_id)],
    }


# ---------------------------------------------------------------------------------------
# Chinese numerals
# ---------------------------------------------------------------------------------------

_CN_DIGITS = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
_CN_SMALL = {"十": 10, "百": 100, "千": 1000}
_CN_BIG = {"万": 10**4, "亿": 10**8}
_CN_NUMERAL = set(_CN_DIGITS) | set(_CN_SMALL) | set(_CN_BIG)
_FULLWIDTH = str.maketrans("０１２３４５６７８９％", "0123456789%")

# Words that contain numeral characters but are not numbers; left as they are.
NOT_NUMBERS = (
    "一下", "一些", "一起", "一直", "一样", "一切", "一般", "一定", "一旦", "一边", "一会", "一向",
    "一律", "一并", "一致", "一同", "一再", "一点儿", "一点点", "一共", "一方面", "一时", "一番",
    "一概", "一贯", "一路", "一心", "一面", "一早", "一阵", "一口气", "一开始", "一旁", "一体",
    "一模一样", "一目了然", "一清二楚", "一五一十", "一举两得", "一一", "统一", "唯一", "之一",
    "逐一", "万一", "千万", "万分", "十分", "十足", "十全十美", "三心二意", "七上八下", "乱七八糟",
    "五花八门", "九死一生", "四处", "零食", "零钱", "零件", "零散", "零星",
)
_NOT_NUMBERS_BY_FIRST: dict[str, list[str]] = {}
for _w in sorted(NOT_NUMBERS, key=len, reverse=True):
    _NOT_NUMBERS_BY_FIRST.setdefault(_w[0], []).append(_w)

_ARABIC_RE = re.compile(r"\d+(?:\.\d+)?")


def _fmt_decimal(d: Decimal) -> str:
    if d == d.to_integral_value():
        return str(int(d))
    return format(d.normalize(), "f")


def _parse_cn_int(run: str) -> int | None:
    """A run of Chinese numeral characters → int, or None when it is not a number."""
    if all(ch in _CN_DIGITS for ch in run):
        return int("".join(str(_CN_DIGITS[ch]) for ch in run))  # 一二三 → 123, 二〇二四 → 2024
    total = section = number = last_unit = 0
    pending = after_zero = False
    for ch in run:
        if ch in _CN_DIGITS:
            number, pending = _CN_DIGITS[ch], True
            after_zero = after_zero or _CN_DIGITS[ch] == 0
        elif ch in _CN_SMALL:
            if not pending:
                if ch != "十":
                    return None  # 百/千 without a digit before it
                number = 1  # 十二 = 一十二
            section += number * _CN_SMALL[ch]
            number, pending, last_unit, after_zero = 0, False, _CN_SMALL[ch], False
        else:
            section += number
            if section == 0 and total == 0:
                return None  # 万一, 千万 without a leading digit
            if ch == "亿":
                total = (total + section) * _CN_BIG[ch]
            else:
                total += section * _CN_BIG[ch]
            section, number, pending, last_unit, after_zero = 0, 0, False, _CN_BIG[ch], False
    if pending and last_unit >= 100 and not after_zero:
        number *= last_unit // 10  # 一百二 → 120, 两万五 → 25000
    return total + section + number


def _convert(text: str) -> tuple[str, set[int]]:
    """Chinese numerals → Arabic digits; also returns the output offsets of every "1" that
    came from a lone 一 (an article-like "one", e.g. 一个, 一次)."""
    text = text.translate(_FULLWIDTH)
    out: list[str] = []
    bare: set[int] = set()
    length = 0
    i, n = 0, len(text)

    def emit(s: str) -> None:
        nonlocal length
        out.append(s)
        length += len(s)

    def number_at(j: int) -> tuple[Decimal, int] | None:
        """Parse a number (Arabic or Chinese, with 点 decimals) starting at j."""
        m = _ARABIC_RE.match(text, j)
        if m:
            return Decimal(m.group()), m.end()
        k = j
        while k < n and text[k] in _CN_NUMERAL:
            k += 1
        if k == j:
            return None
        whole = _parse_cn_int(text[j:k])
        if whole is None:
            return None
        value = Decimal(whole)
        if k + 1 < n and text[k] == "点" and text[k + 1] in _CN_DIGITS:
            f = k + 1
            while f < n and text[f] in _CN_DIGITS:
                f += 1
            if not (f < n and text[f] in _CN_SMALL):  # 三点五十分 is a time, not 3.5
                frac = "".join(str(_CN_DIGITS[ch]) for ch in text[k + 1 : f])
                value = Decimal(f"{whole}.{frac}")
                k = f
                if k < n and text[k] in _CN_BIG:
                    value *= _CN_BIG[text[k]]
                    k += 1
        return value, k

    while i < n:
        ch = text[i]
        idiom = next(
            (w for w in _NOT_NUMBERS_BY_FIRST.get(ch, ()) if text.startswith(w, i)
             and (w[0] not in _CN_NUMERAL or i == 0 or (text[i - 1] not in _CN_NUMERAL and not text[i - 1].isdigit()))),
            None,
        )
        if text.startswith("百分之", i):
            parsed = number_at(i + 3)
            if parsed:
                emit(f"{_fmt_decimal(parsed[0])}%")
                i = parsed[1]
                continue
        if idiom:
            emit(idiom)
            i += len(idiom)
            continue
        if text.startswith("零下", i) and i + 2 < n and (text[i + 2] in _CN_NUMERAL or text[i + 2].isdigit()):
            emit("-")
            i += 2
            continue
        if ch.isascii() and ch.isdigit():
            m = _ARABIC_RE.match(text, i)
            assert m is not None
            value, j = Decimal(m.group()), m.end()
            k = j
            while k < n and text[k] in _CN_SMALL or (k < n and text[k] in _CN_BIG):
                value *= _CN_SMALL.get(text[k]) or _CN_BIG[text[k]]
                k += 1
            if k == j:  # "4500 万": a space before 万/亿 still multiplies
                sp = j
                while sp < n and text[sp] == " ":
                    sp += 1
                if sp > j and sp < n and text[sp] in _CN_BIG and not text.startswith("万一", sp):
                    value *= _CN_BIG[text[sp]]
                    k = sp + 1
            emit(_fmt_decimal(value) if k > j else m.group())
            i = k
            continue
        if ch in _CN_NUMERAL:
            j = i
            while j < n and text[j] in _CN_NUMERAL:
                j += 1
            run = text[i:j]
            if len(run) == 2 and all(c in _CN_DIGITS for c in run) and (
                run == "一两" or (_CN_DIGITS[run[1]] == _CN_DIGITS[run[0]] + 1 and run[0] not in "零〇")
            ):
                emit(f"{_CN_DIGITS[run[0]]}到{_CN_DIGITS[run[1]]}")  # 两三个 = two or three
                i = j
                continue
            parsed = number_at(i)
            if parsed is None:
                emit(run)
                i = j
                continue
            value, end = parsed
            if run == "一" and end == j:
                bare.add(length)
            emit(_fmt_decimal(value))
            i = end
            continue
        emit(ch)
        i += 1
    return "".join(out), bare


def chinese_to_arabic(text: str) -> str:
    """Convert Chinese numerals in running text to Arabic digits.

    十二 → 12, 二十 → 20, 一百零五 → 105, 三千二百 → 3200, 两万 → 20000, 一百二 → 120,
    一点五 → 1.5, 百分之二十 → 20%, 3万 (or "3 万") → 30000, 1.5万 → 15000, 二〇二四 → 2024,
    两三 → "2到3" (a range), 零下五 → -5. 半 is not converted. Fixed words that contain
    numeral characters but are not numbers (一下, 一起, 十分, 万一, 千万, 唯一, … see
    ``NOT_NUMBERS``) are left as they are, as is all other text.
    """
    return _convert(text)[0]


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


# ---------------------------------------------------------------------------------------
# Status words, retry suggestions
# ---------------------------------------------------------------------------------------

# Checked in this order; a match is blanked before the next category is looked for, so
# 没有成功 is a failure claim and not also a success claim.
STATUS_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("partial", ("只完成了一部分", "完成了一部分", "只办好了一部分", "办好了一部分", "部分完成", "部分成功",
                 "成功了一部分", "partially")),
    ("working", ("还在办", "正在", "处理中", "进行中", "排队", "排上队", "还没完成", "还没有完成", "尚未完成",
                 "还没办完", "还没好", "等你确认", "等待确认", "等你的确认",
                 "in progress", "still working", "still running", "working on it", "queued", "pending",
                 "not done yet", "not finished yet", "waiting for your confirmation")),
    ("failed", ("失败", "没成功", "没有成功", "未成功", "不成功", "没办成", "没能", "没发出去", "没有发出",
                "未发送", "没发送", "出错", "没完成", "没有完成", "未完成", "办不了",
                "failed", "fail", "unsuccessful", "did not go through", "didn't go through", "not sent",
                "wasn't sent", "was not sent", "couldn't", "could not", "didn't work", "did not work")),
    ("cancelled", ("已取消", "取消了", "已经取消", "cancelled", "canceled")),
    ("noted", ("记下了", "记下来了", "记住了", "已记住", "已记下", "已记录", "记录好了", "记好了", "已保存",
               "保存好了", "保存了", "存好了", "帮你记着", "noted", "saved", "remembered", "i'll remember")),
    ("done", ("办好了", "办完了", "已完成", "完成了", "完成", "已发送", "发送了", "发好了", "发出去了", "已发出",
              "成功", "搞定", "弄好了", "做好了", "写好了", "已写入", "已办妥",
              "done", "sent", "finished", "completed", "succeeded", "successfully", "success")),
)
# Which receipt statuses back a claim.
CLAIM_STATUSES: dict[str, frozenset[str]] = {
    "partial": frozenset({"partial"}),
    "working": frozenset({"running", "queued", "waiting"}),
    "failed": frozenset({"failed"}),
    "cancelled": frozenset({"cancelled"}),
    "noted": frozenset({"succeeded"}),
    "done": frozenset({"succeeded"}),
}
RETRY_WORDS = (
    "再发一次", "再发一遍", "再发", "再发送", "重新发送", "重新发", "重发", "再试一次", "再试一下", "再试试",
    "再试", "重试", "再来一次", "重来", "再做一次", "重做", "再执行", "重新执行", "再提交", "重新提交",
    "再运行", "重新运行", "再跑一次",
    "again", "retry", "resend", "re-send", "try again", "redo", "re-run", "rerun",
)
NEGATORS = ("不要", "不用", "别", "无需", "不必", "不需要", "没必要", "勿", "不能", "不可以",
            "don't", "do not", "no need", "not", "never", "shouldn't", "should not")


_A_NOT_A = ("要不要", "能不能", "可不可以", "用不用", "需不需要", "需要不需要")


def _phrase_re(phrases: Iterable[str]) -> re.Pattern[str]:
    parts = []
    for p in sorted(phrases, key=len, reverse=True):
        e = re.escape(p)
        parts.append(rf"\b{e}\b" if p.isascii() else e)
    return re.compile("|".join(parts), re.IGNORECASE)


_STATUS_RES = tuple((claim, _phrase_re(words)) for claim, words in STATUS_WORDS)
# Beyond the word list: 再 + verb + 一次/一遍 (再设一次, 再写一遍) and 重新 + a doing verb.
RETRY_PATTERNS = (r"再[\u4e00-\u9fff]{1,2}一[次遍]", r"重新(?:发|做|执行|提交|运行|创建|设|写|下单|支付|付|来|弄|订)")
_RETRY_RE = re.compile(_phrase_re(RETRY_WORDS).pattern + "|" + "|".join(RETRY_PATTERNS), re.IGNORECASE)


def status_claims(sentence: str) -> set[str]:
    """The status claims a sentence makes (partial/working/failed/cancelled/noted/done).
    A question makes no claim."""
    s = sentence.strip()
    if s.endswith(("?", "？")) or re.search(r"吗\W*$", s):
        return set()
    claims: set[str] = set()
    work = s
    for claim, rx in _STATUS_RES:
        def blank(m: re.Match[str], claim: str = claim) -> str:
            claims.add(claim)
            return "\x00" * len(m.group())
        work = rx.sub(blank, work)
    return claims


def suggests_retry(sentence: str) -> bool:
    """Whether a sentence suggests doing the action again (a negated one does not)."""
    low = sentence.lower()
    for m in _RETRY_RE.finditer(low):
        before = low[max(0, m.start() - 14) : m.start()]
        for question in _A_NOT_A:  # 要不要再发一次 asks, it does not negate
            before = before.replace(question, "")
        if not any(re.search(rf"\b{re.escape(n)}\b" if n.isascii() else re.escape(n), before) for n in NEGATORS):
            return True
    return False


# ---------------------------------------------------------------------------------------
# Sentences
# ---------------------------------------------------------------------------------------

_ENDERS = set("。！？!?；;\n")
_CLOSERS = set("”’\"'）)」』】")


def split_sentences(text: str) -> list[str]:
    """Split at 。！？!?；; and newlines, and at "." followed by a space or the end (so
    decimals such as 3.5 stay whole). Each piece keeps its closing marks and trailing
    whitespace, so ``"".join(split_sentences(t)) == t``."""
    out: list[str] = []
    start, i, n = 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch in _ENDERS or (ch == "." and (i + 1 == n or text[i + 1].isspace())):
            j = i + 1
            while j < n and (text[j] in _ENDERS or text[j] in _CLOSERS or text[j].isspace()):
                j += 1
            out.append(text[start:j])
            start = i = j
            continue
        i += 1
    if start < n:
        out.append(text[start:])
    return out


def _norm(s: str) -> str:
    return re.sub(r"[\W_]+", "", chinese_to_arabic(s)).lower()


# ---------------------------------------------------------------------------------------
# The checker
# ---------------------------------------------------------------------------------------


@dataclass
class _Evidence:
    values: list[tuple[float, str]]  # numeric receipt values with their unit
    loose: set[float]  # numbers spelled in receipt texts (content, targets, …) and facts
    units: list[str]  # unit spellings to recognize, longest first
    statuses: set[str]
    verified_targets: list[str]
    noted_ok: bool
    forbidden_done: bool


def _evidence(receipts: list[dict[str, Any]], facts: list[Fact]) -> _Evidence:
    values: list[tuple[float, str]] = []
    texts: list[str] = []
    statuses: set[str] = set()
    verified_targets: list[str] = []
    noted_ok = forbidden_done = False
    for r in receipts:
        status = r.get("status")
        statuses.add(status)
        for item in r.get("values") or []:
            if _is_number(item.get("value")):
                if item.get("unit"):
                    values.append((float(item["value"]), str(item["unit"])))
            else:
                texts.append(str(item.get("value")))
            texts.append(str(item.get("name", "")))
        content = r.get("content") or {}
        texts.append(str(content.get("text", "")))
        if content.get("items"):
            texts.append(json.dumps(content["items"], ensure_ascii=False))
        for eff in r.get("effects") or []:
            texts.append(str(eff.get("target", "")))
            if eff.get("verification") in ("verified", "service_ack") and eff.get("target"):
                verified_targets.append(str(eff["target"]))
            if status == "succeeded" and eff.get("verification") == "verified" and eff.get("category") in ("owner_data", "workspace"):
                noted_ok = True
        texts.extend(str(u) for u in r.get("unknowns") or [])
        err = r.get("error") or {}
        texts.extend(str(err.get(k, "")) for k in ("code", "message"))
        nxt = r.get("next") or {}
        texts.append(str(nxt.get("check_with") or ""))
        if nxt.get("retry") == "forbidden" and status == "succeeded":
            forbidden_done = True
    texts.extend(f.text for f in facts if f.kind != "values")  # values match with their unit
    loose: set[float] = set()
    for t in texts:
        loose |= _loose_numbers(t)
    units = {s for s in _UNIT_INDEX} | {u.lower() for _, u in values} | {f.unit.lower() for f in facts if f.unit}
    return _Evidence(values, loose, sorted(units, key=len, reverse=True), statuses, verified_targets, noted_ok, forbidden_done)


def _matches(num: _Number, value: float, unit: str | None) -> bool:
    return _same(num.value, value) and (num.unit is None or unit is None or units_compatible(num.unit, unit))


def _checked(num: _Number, ev: _Evidence) -> bool:
    """A lone 一 (一个, 一次) is an article more often than a count: it is checked only when
    its unit is a specific one some receipt value uses."""
    if not num.bare_one:
        return True
    if num.unit is None or canonical_unit(num.unit) == "count":
        return False
    return any(units_compatible(num.unit, u) for _, u in ev.values)


def _number_ok(num: _Number, ev: _Evidence) -> bool:
    if not _checked(num, ev):
        return True
    if any(_matches(num, v, u) for v, u in ev.values):
        return True
    return any(_same(num.value, x) for x in ev.loose)


def _claim_reason(sentence: str, claims: set[str], ev: _Evidence) -> str | None:
    for claim in sorted(claims):
        if claim == "noted":
            if not ev.noted_ok:
                return "noted_without_verified_effect"
            continue
        if ev.statuses & CLAIM_STATUSES[claim]:
            continue
        if claim == "done" and any(t in sentence for t in ev.verified_targets):
            continue  # "已发送给 X": that effect is verified, even if the call was partial
        return "status_contradicts_receipts"
    return None


def _stated(fact: Fact, kept_text: str, claims: set[str], numbers: list[_Number], ev: _Evidence) -> bool:
    norm_kept = _norm(kept_text)
    if any(_norm(t) and _norm(t) in norm_kept for t in (fact.text, fact.voice)):
        return True
    if fact.kind == "values":
        if fact.number is not None:
            return any(_checked(n, ev) and _matches(n, fact.number, fact.unit) for n in numbers)
        return bool(_norm(str(fact.value))) and _norm(str(fact.value)) in norm_kept
    if fact.kind == "status":
        return any(fact.status in CLAIM_STATUSES[c] for c in claims)
    if fact.kind == "effects" and fact.verification in ("verified", "service_ack") and fact.target:
        return fact.target in kept_text
    return False


def check_reply(
    text: str,
    *,
    receipts: list[dict[str, Any]],
    delivered_fact_ids: set[str] | frozenset[str],
    facts: list[Fact],
    lang: str = "zh",
    voice: bool = False,
) -> CheckResult:
    """Remove the sentences of a model reply that disagree with the receipts, then append
    the undelivered facts it does not state. Deterministic; zero model calls.

    Per sentence (numbers read after ``chinese_to_arabic``), the first failing rule removes it:

    - ``number_not_in_receipts``: every number (with its adjacent unit, if any) must equal a
      receipt value with a compatible unit (``units_compatible``), or be spelled somewhere
      in the receipts' texts (content text/items, effect targets, string values, unknowns,
      error, check_with) or in a fact text — those match by value only. Ordinals (第二),
      numbers glued to letters (S3) and an article-like lone 一 are not checked. Times and
      dates are plain numbers: they must be in the receipts too.
    - ``status_contradicts_receipts`` / ``noted_without_verified_effect``: a status word
      (``STATUS_WORDS``) must be backed by some receipt: done → succeeded (or the sentence
      names the target of a verified/service_ack effect), failed → failed, working →
      running/queued/waiting, partial → partial, cancelled → cancelled, noted → a succeeded
      receipt with a ``verified`` owner_data or workspace effect. Questions claim nothing.
    - ``suggests_forbidden_retry``: if a receipt succeeded with ``retry: forbidden``, no
      sentence may suggest doing it again (``RETRY_WORDS``/``RETRY_PATTERNS``, unless
      negated: 不要再发一次; 要不要再发一次？ is a suggestion).
    - ``repeats_delivered_fact``: a sentence containing the text of a delivered fact (or
      equal to its voice version), or giving the number+unit of a delivered values fact
      that no undelivered values fact shares.

    Then every fact of ``facts`` not in ``delivered_fact_ids`` and not stated by the kept text
    (values: the number with a compatible unit; status: a status word backing it; verified
    effects: the target named; otherwise the fact's text) is appended: its ``voice`` version
    when ``voice=True`` or ``lang`` ends in "voice", else its ``text``. Added texts that
    are identical are written once. Facts not passed in ``facts`` cannot be added or
    recognized as repeats.
    """
    voice = voice or lang.endswith("voice")
    ev = _evidence(receipts, facts)
    delivered_values = [f for f in facts if f.kind == "values" and f.number is not None and f.id in delivered_fact_ids]
    fresh_values = [f for f in facts if f.kind == "values" and f.number is not None and f.id not in delivered_fact_ids]
    delivered = [f for f in facts if f.id in delivered_fact_ids]

    kept: list[str] = []
    removed: list[tuple[str, str]] = []
    kept_claims: set[str] = set()
    kept_numbers: list[_Number] = []
    for sentence in split_sentences(text):
        stripped = sentence.strip()
        if not stripped:
            kept.append(sentence)
            continue
        numbers = _numbers(stripped, ev.units)
        claims = status_claims(stripped)
        reason: str | None = None
        if any(not _number_ok(n, ev) for n in numbers):
            reason = "number_not_in_receipts"
        if reason is None:
            reason = _claim_reason(stripped, claims, ev)
        if reason is None and ev.forbidden_done and suggests_retry(stripped):
            reason = "suggests_forbidden_retry"
        if reason is None:
            norm = _norm(stripped)
            if any((_norm(f.text) and _norm(f.text) in norm) or norm == _norm(f.voice) for f in delivered) or any(
                _checked(n, ev)
                and any(_matches(n, f.number, f.unit) for f in delivered_values if f.number is not None)
                and not any(_matches(n, f.number, f.unit) for f in fresh_values if f.number is not None)
                for n in numbers
            ):
                reason = "repeats_delivered_fact"
        if reason:
            removed.append((stripped, reason))
        else:
            kept.append(sentence)
            kept_claims |= claims
            kept_numbers.extend(numbers)

    kept_text = "".join(kept).strip()
    told: list[str] = []
    added: list[Fact] = []
    for fact in facts:
        if fact.id in told:
            continue
        if _stated(fact, kept_text, kept_claims, kept_numbers, ev):
            told.append(fact.id)
        elif fact.id not in delivered_fact_ids:
            added.append(fact)
            told.append(fact.id)

    pieces: list[str] = []
    for fact in added:
        piece = fact.voice if voice else fact.text
        if piece not in pieces:
            pieces.append(piece)
    sep = "" if lang.startswith("zh") or lang == "voice" else " "
    final = kept_text
    if pieces:
        if final and not re.search(r"[。！？!?；;.…」”)）]$", final):
            final += "。" if sep == "" else "."
        final = (final + sep if final else "") + sep.join(pieces)
    return CheckResult(text=final, removed=removed, added=added, told=told)
