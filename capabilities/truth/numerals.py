"""Chinese numerals in running text → Arabic digits (``chinese_to_arabic``).

The checker reads every number after this conversion, so 十二 and 12 are the same number.
``_convert`` also gives the offsets of each "1" that came from a lone 一 (一个, 一次), which
is an article more often than a count.
"""

from __future__ import annotations

import re
from decimal import Decimal

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
    if _CN_NUMERAL.isdisjoint(text):
        return text, set()  # no Chinese numeral: nothing below would change a character
    return _scan(text)


def _scan(text: str) -> tuple[str, set[int]]:
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
