"""Usage records: one ``ModelUsage`` row per model call, main turns, sub-agents and report
turns alike (``llm.client.complete`` records every call it makes, failed ones included).

Tokens. The provider's ``usage`` object (the stream's final event when the request asks
for it with ``stream_options.include_usage``) is read by ``usage_from_provider``:

- OpenAI shape: ``prompt_tokens`` (all input, cached included), ``completion_tokens``,
  ``prompt_tokens_details.cached_tokens`` (cache read); DeepSeek's
  ``prompt_cache_hit_tokens`` is read as cache read too.
- Anthropic-compatible cache fields ``cache_read_input_tokens`` and
  ``cache_creation_input_tokens`` (cache write) are read when present. If the object is in
  Anthropic's own shape (``input_tokens``/``output_tokens``, where ``input_tokens`` excludes
  the cache), the stored input is ``input_tokens + cache read + cache write``, so that
  ``input_tokens`` always means all input and the cache columns are parts of it.

No usage from the provider → ``unknown``: every count NULL, never 0. Only when the role's
option ``estimate_usage`` is on are tokens counted here (``estimate_tokens``), and the row
says ``estimated``. A failed call records its error code as ``outcome`` and ``unknown``
tokens (what a failed call was billed is not known here).

Cost. ``YIMI_MODEL_PRICES_FILE`` (JSON; no prices ship with Yimi) lists prices per million
tokens for a provider and model::

    {"currency": "USD",
     "prices": [{"provider": "deepseek", "model": "deepseek-chat",
                 "input": 0.27, "output": 1.10, "cache_read": 0.07, "cache_write": 0.27}]}

``input`` and ``output`` are required, ``cache_read``/``cache_write`` optional; numbers or
decimal strings, never negative. The cost is computed when the row is recorded:
uncached input × input + cache read × cache_read + cache write × cache_write + output ×
output. No price for the provider and model, or no token counts → cost NULL and
``cost_source = unknown`` (never 0). Estimated tokens, a missing cache price standing in
at the input price, or cache counts the provider did not report while the table prices the
cache differently → ``estimated``. Otherwise ``priced``.

Recording never breaks a reply: a database error while recording is logged
(``model_usage_not_recorded``), not raised.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from channels.db import database_sync_to_async
from django.conf import settings
from django.db.models import Count, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from llm.models import ModelUsage
from yimi_project.errors import YimiError
from yimi_project.infra import statements
from yimi_project.logs import log_event

MILLION = Decimal(1_000_000)


# --- token counts -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenUsage:
    """The token counts of one call and where they came from. ``None`` is "not known"."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    source: str = ModelUsage.TokensSource.UNKNOWN

    @property
    def total(self) -> int | None:
        if self.input_tokens is None and self.output_tokens is None:
            return None
        return (self.input_tokens or 0) + (self.output_tokens or 0)


UNKNOWN_USAGE = TokenUsage()


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or value != value:
        return None
    return int(value)


def usage_from_provider(raw: Any) -> TokenUsage | None:
    """The provider's ``usage`` object as ``TokenUsage`` (``reported``), or None when there
    is none or it carries no input or output count (then the call's usage is unknown)."""
    if not isinstance(raw, dict):
        return None
    details = raw.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    cache_read = _count(raw.get("cache_read_input_tokens"))
    if cache_read is None:
        cache_read = cached if cached is not None else _count(raw.get("prompt_cache_hit_tokens"))
    cache_write = _count(raw.get("cache_creation_input_tokens"))
    if "prompt_tokens" in raw or "completion_tokens" in raw:
        input_tokens, output_tokens = _count(raw.get("prompt_tokens")), _count(raw.get("completion_tokens"))
    else:  # Anthropic's own shape: input_tokens excludes what was read from or written to the cache
        input_tokens, output_tokens = _count(raw.get("input_tokens")), _count(raw.get("output_tokens"))
        if input_tokens is not None:
            input_tokens += (cache_read or 0) + (cache_write or 0)
    if input_tokens is None and output_tokens is None:
        return None
    return TokenUsage(input_tokens, output_tokens, cache_read, cache_write, ModelUsage.TokensSource.REPORTED)


def _is_wide(char: str) -> bool:
    code = ord(char)
    return (
        0x2E80 <= code <= 0x9FFF  # CJK radicals, punctuation, kana, ideographs
        or 0xAC00 <= code <= 0xD7AF  # hangul syllables
        or 0xF900 <= code <= 0xFAFF  # CJK compatibility ideographs
        or 0xFF00 <= code <= 0xFFEF  # fullwidth forms
        or 0x20000 <= code <= 0x3FFFF  # CJK extensions
    )


def count_text_tokens(text: str) -> int:
    """A rough local count: one token per CJK character (ideographs, kana, hangul,
    fullwidth forms), one per 4 other characters, rounded up. Real tokenizers differ by
    model; this is why a count made here is labelled ``estimated``."""
    wide = sum(1 for c in text if _is_wide(c))
    return wide + math.ceil((len(text) - wide) / 4)


MESSAGE_OVERHEAD = 4  # role and separators, per message


def estimate_tokens(messages: Iterable[dict[str, Any]], text: str, *, tools: list[dict[str, Any]] | None = None) -> TokenUsage:
    """Estimated input (every message's text and tool calls, plus ``MESSAGE_OVERHEAD`` per
    message, plus the tool definitions as JSON) and output (``text``) of one call. Cache
    counts stay unknown: nothing here can tell what a provider cached."""
    input_tokens = 0
    for message in messages:
        input_tokens += MESSAGE_OVERHEAD
        content = message.get("content")
        if isinstance(content, str):
            input_tokens += count_text_tokens(content)
        elif isinstance(content, list):  # content parts: count their text
            input_tokens += sum(count_text_tokens(str(p.get("text", ""))) for p in content if isinstance(p, dict))
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            input_tokens += count_text_tokens(str(function.get("name", "")) + str(function.get("arguments", "")))
    if tools:
        input_tokens += count_text_tokens(json.dumps(tools, ensure_ascii=False))
    return TokenUsage(input_tokens, count_text_tokens(text), None, None, ModelUsage.TokensSource.ESTIMATED)


# --- prices -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Price:
    """Per million tokens, in ``currency``."""

    input: Decimal
    output: Decimal
    cache_read: Decimal | None
    cache_write: Decimal | None
    currency: str


_price_cache: dict[str, tuple[float, dict[tuple[str, str], Price]]] = {}


def _price(value: Any, where: str, *, required: bool) -> Decimal | None:
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise YimiError("invalid_price_file", f"{where}: a price must be a number")
    try:
        price = Decimal(str(value))
    except InvalidOperation:
        raise YimiError("invalid_price_file", f"{where}: {value!r} is not a number") from None
    if not price.is_finite() or price < 0:
        raise YimiError("invalid_price_file", f"{where}: a price must be a finite number ≥ 0")
    return price


def parse_prices(raw: Any) -> dict[tuple[str, str], Price]:
    """The price table in ``YIMI_MODEL_PRICES_FILE``'s format (module docstring), keyed by
    (provider, model). Raises ``YimiError("invalid_price_file")``."""
    if not isinstance(raw, dict) or not isinstance(raw.get("prices"), list):
        raise YimiError("invalid_price_file", 'the price file must be an object with a "prices" list')
    currency = raw.get("currency")
    if not isinstance(currency, str) or not 1 <= len(currency) <= 8:
        raise YimiError("invalid_price_file", 'the price file needs a "currency" (e.g. "USD")')
    table: dict[tuple[str, str], Price] = {}
    for index, entry in enumerate(raw["prices"]):
        where = f"prices[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("provider"), str) or not isinstance(entry.get("model"), str):
            raise YimiError("invalid_price_file", f"{where}: needs a provider and a model (strings)")
        key = (entry["provider"], entry["model"])
        if key in table:
            raise YimiError("invalid_price_file", f"{where}: {key[0]} / {key[1]} is listed twice")
        table[key] = Price(
            input=_price(entry.get("input"), f"{where}.input", required=True) or Decimal(0),
            output=_price(entry.get("output"), f"{where}.output", required=True) or Decimal(0),
            cache_read=_price(entry.get("cache_read"), f"{where}.cache_read", required=False),
            cache_write=_price(entry.get("cache_write"), f"{where}.cache_write", required=False),
            currency=currency,
        )
    return table


def prices_file() -> str:
    return str(getattr(settings, "YIMI_MODEL_PRICES_FILE", "") or "")


def load_prices() -> dict[tuple[str, str], Price]:
    """The configured price table (empty when ``YIMI_MODEL_PRICES_FILE`` is not set), re-read
    when the file changes. Raises ``YimiError("invalid_price_file")`` for an unreadable or
    invalid file."""
    path = prices_file()
    if not path:
        return {}
    try:
        mtime = Path(path).stat().st_mtime
        cached = _price_cache.get(path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise YimiError("invalid_price_file", f"the price file cannot be read ({exc.strerror})") from None
    except ValueError as exc:
        raise YimiError("invalid_price_file", f"the price file is not valid JSON ({exc})") from None
    table = parse_prices(raw)
    _price_cache[path] = (mtime, table)
    return table


def cost_of(tokens: TokenUsage, price: Price | None) -> tuple[Decimal | None, str]:
    """(cost, cost_source) of one call: see the module docstring."""
    if price is None or tokens.input_tokens is None or tokens.output_tokens is None:
        return None, ModelUsage.CostSource.UNKNOWN
    estimated = tokens.source != ModelUsage.TokensSource.REPORTED
    cache_read, cache_write = tokens.cache_read_tokens or 0, tokens.cache_write_tokens or 0
    read_price, write_price = price.cache_read, price.cache_write
    if read_price is None:
        estimated |= cache_read > 0
        read_price = price.input
    elif tokens.cache_read_tokens is None and read_price != price.input:
        estimated = True  # the provider did not say how much was cached: all input at the input price
    if write_price is None:
        estimated |= cache_write > 0
        write_price = price.input
    elif tokens.cache_write_tokens is None and write_price != price.input:
        estimated = True
    uncached = max(tokens.input_tokens - cache_read - cache_write, 0)
    cost = (uncached * price.input + cache_read * read_price + cache_write * write_price + tokens.output_tokens * price.output) / MILLION
    source = ModelUsage.CostSource.ESTIMATED if estimated else ModelUsage.CostSource.PRICED
    return cost.quantize(Decimal("0.00000001")), source


# --- recording --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallContext:
    """What a model call is for: the run, and the sub-agent task (a sub-agent's own turn,
    or, for a report turn, the task it reports on). The role comes from the call's
    ``RoleSettings``."""

    run_id: Any = None
    agent_task_id: Any = None
    # Given: the calls' records wait here (their fields) for the caller's next trip to the
    # database, which writes them (``record_deferred``): the runner's main turn, whose
    # reply is stored right after its call, so a run takes one database trip fewer.
    deferred: list[dict[str, Any]] | None = field(default=None, compare=False)


def record_call(
    context: CallContext,
    *,
    role: str,
    provider: str,
    model: str,
    tokens: TokenUsage,
    duration_ms: int,
    outcome: str,
    now: datetime | None = None,
) -> ModelUsage:
    """The only writer of ``ModelUsage``: one row for one call, its cost priced now from the
    price table (an invalid price file leaves the cost unknown and is logged)."""
    try:
        price = load_prices().get((provider, model))
    except YimiError as exc:
        log_event("model_prices_invalid", code=exc.code, detail=exc.message)
        price = None
    cost, cost_source = cost_of(tokens, price)
    usage = ModelUsage(
        role=role[:32],
        provider=provider[:128],
        model=model[:200],
        run_id=context.run_id,
        agent_task_id=context.agent_task_id,
        created_at=now or timezone.now(),
        input_tokens=tokens.input_tokens,
        output_tokens=tokens.output_tokens,
        cache_read_tokens=tokens.cache_read_tokens,
        cache_write_tokens=tokens.cache_write_tokens,
        tokens_source=tokens.source,
        cost=cost,
        currency=price.currency if price is not None and cost is not None else "",
        cost_source=cost_source,
        duration_ms=max(int(duration_ms), 0),
        outcome=outcome[:32] or "ok",
    )
    statements.insert(usage)  # on every model call: the INSERT's text built once per process
    return usage


async def record_call_safely(context: CallContext, *, role: str, **fields: Any) -> ModelUsage | None:
    """``record_call`` from async code; a failure to record is logged, never raised (a
    reply never fails because its usage could not be written). Shielded, so a call
    cancelled while recording still records. With ``context.deferred`` the record waits
    there instead (stamped now) and None is returned."""
    if context.deferred is not None:
        context.deferred.append({"role": role, **fields, "now": fields.get("now") or timezone.now()})
        return None
    try:
        return await asyncio.shield(database_sync_to_async(record_call)(context, role=role, **fields))
    except Exception as exc:  # noqa: BLE001 - recording must not break the reply
        log_event("model_usage_not_recorded", role=role, run_id=str(context.run_id or ""), error=type(exc).__name__)
        return None


def record_deferred(context: CallContext) -> None:
    """Write the records waiting in ``context.deferred`` (``record_call_safely``) and empty
    it; a failure to write is logged, never raised, as for a call recorded at once."""
    waiting = context.deferred or []
    while waiting:
        fields = waiting.pop(0)
        try:
            record_call(context, **fields)
        except Exception as exc:  # noqa: BLE001 - recording must not break the reply
            log_event("model_usage_not_recorded", role=fields.get("role", ""), run_id=str(context.run_id or ""), error=type(exc).__name__)


async def record_deferred_safely(context: CallContext) -> None:
    """``record_deferred`` from async code, shielded: for a caller that ends without the
    database trip that would have written them (it failed, or was cancelled)."""
    if context.deferred:
        await asyncio.shield(database_sync_to_async(record_deferred)(context))


# --- the console: usage by role and by day ----------------------------------------------------


@dataclass
class DayRole:
    """One role's calls on one day."""

    day: date
    role: str
    calls: int = 0
    failed: int = 0
    reported_calls: int = 0
    estimated_calls: int = 0
    unknown_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reported_tokens: int = 0  # input + output of reported calls
    estimated_tokens: int = 0  # input + output of estimated calls
    unpriced_calls: int = 0
    estimated_cost_calls: int = 0
    cost: dict[str, Decimal] = field(default_factory=dict)  # per currency, priced and estimated calls

    @property
    def cost_text(self) -> str:
        text = ", ".join(f"{'~' if self.estimated_cost_calls else ''}{amount.normalize():f} {currency}" for currency, amount in sorted(self.cost.items()))
        if self.unpriced_calls:
            unknown = f"unknown for {self.unpriced_calls} call{'s' if self.unpriced_calls != 1 else ''}"
            text = f"{text} + {unknown}" if text else unknown
        return text or "—"


@dataclass
class UsageSummary:
    days: list[date]
    roles: list[str]
    rows: list[DayRole]

    def cell(self, day: date, role: str) -> DayRole | None:
        return next((r for r in self.rows if r.day == day and r.role == role), None)


def usage_summary(days: int = 14, *, now: datetime | None = None) -> UsageSummary:
    """Usage by role and by day (days in the deployment's time zone) for the last ``days``
    days, today included."""
    today = timezone.localdate(now or timezone.now())
    first = today - timedelta(days=days - 1)
    start = timezone.make_aware(datetime.combine(first, datetime.min.time()))
    grouped = (
        ModelUsage.objects.filter(created_at__gte=start)
        .annotate(day=TruncDate("created_at"))
        .values("day", "role", "tokens_source", "cost_source", "currency", "outcome")
        .annotate(
            calls=Count("id"), input=Sum("input_tokens"), output=Sum("output_tokens"),
            cache_read=Sum("cache_read_tokens"), cache_write=Sum("cache_write_tokens"), cost=Sum("cost"),
        )
    )
    cells: dict[tuple[date, str], DayRole] = {}
    for g in grouped:
        cell = cells.setdefault((g["day"], g["role"]), DayRole(g["day"], g["role"]))
        calls = g["calls"]
        cell.calls += calls
        cell.failed += calls if g["outcome"] != "ok" else 0
        tokens = (g["input"] or 0) + (g["output"] or 0)
        if g["tokens_source"] == ModelUsage.TokensSource.REPORTED:
            cell.reported_calls += calls
            cell.reported_tokens += tokens
        elif g["tokens_source"] == ModelUsage.TokensSource.ESTIMATED:
            cell.estimated_calls += calls
            cell.estimated_tokens += tokens
        else:
            cell.unknown_calls += calls
        cell.input_tokens += g["input"] or 0
        cell.output_tokens += g["output"] or 0
        cell.cache_read_tokens += g["cache_read"] or 0
        cell.cache_write_tokens += g["cache_write"] or 0
        if g["cost_source"] == ModelUsage.CostSource.UNKNOWN:
            cell.unpriced_calls += calls
        else:
            cell.cost[g["currency"]] = cell.cost.get(g["currency"], Decimal(0)) + (g["cost"] or Decimal(0))
            cell.estimated_cost_calls += calls if g["cost_source"] == ModelUsage.CostSource.ESTIMATED else 0
    rows = sorted(cells.values(), key=lambda c: (c.day, c.role), reverse=True)
    return UsageSummary(
        days=[first + timedelta(days=i) for i in range(days)],
        roles=sorted({r.role for r in rows}),
        rows=rows,
    )


PALETTE = ["#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb", "#332288", "#117733"]


def _nice_step(top: int) -> int:
    raw = max(top, 1) / 4
    magnitude = 10 ** int(math.floor(math.log10(raw))) if raw >= 1 else 1
    for factor in (1, 2, 5, 10):
        if factor * magnitude >= raw:
            return factor * magnitude
    return 10 * magnitude


def _short(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M".replace(".0M", "M")
    if n >= 10_000:
        return f"{n / 1000:.0f}k"
    if n >= 1000:
        return f"{n / 1000:.1f}k".replace(".0k", "k")
    return str(n)


def usage_plot_svg(summary: UsageSummary) -> str:
    """Stacked bars, one per day: tokens (input + output) of each role, reported solid,
    estimated hatched. The bar's total is written above it (``~`` when part of it is
    estimated); calls whose usage is unknown add nothing to the bars and are counted under
    the day instead. Plain SVG, every text escaped."""
    width, height = 760, 340
    left, right, top, bottom = 64, 16, 28, 92
    plot_w, plot_h = width - left - right, height - top - bottom
    colors = {role: PALETTE[i % len(PALETTE)] for i, role in enumerate(summary.roles)}
    totals = {d: sum(r.reported_tokens + r.estimated_tokens for r in summary.rows if r.day == d) for d in summary.days}
    step = _nice_step(max(totals.values(), default=0))
    y_max = step * max(math.ceil(max(totals.values(), default=0) / step), 1)
    slot = plot_w / max(len(summary.days), 1)
    bar_w = max(slot * 0.6, 2)

    def y(value: float) -> float:
        return top + plot_h - plot_h * value / y_max

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="usage-plot" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-labelledby="usage-plot-title" font-family="sans-serif" font-size="11">',
        '<title id="usage-plot-title">Model tokens per day by role (input + output)</title>',
        '<defs><pattern id="estimated-hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
        '<rect width="6" height="6" fill="#ffffff" fill-opacity="0.55"/><line x1="0" y1="0" x2="0" y2="6" stroke="#000" stroke-width="1.5"/>'
        "</pattern></defs>",
    ]
    for i in range(0, y_max // step + 1):  # horizontal grid and the y axis's values
        value = i * step
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{y(value):.1f}" y2="{y(value):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{_short(value)}</text>')
    out.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}" stroke="#333"/>')
    out.append(f'<line x1="{left}" x2="{width - right}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="#333"/>')
    out.append(
        f'<text x="14" y="{top + plot_h / 2:.1f}" transform="rotate(-90 14 {top + plot_h / 2:.1f})" text-anchor="middle">'
        "tokens per day (input + output)</text>"
    )
    label_every = max(math.ceil(len(summary.days) / 16), 1)
    for index, day in enumerate(summary.days):
        x = left + slot * index + (slot - bar_w) / 2
        base = 0.0
        estimated_any = False
        for role in summary.roles:
            cell = summary.cell(day, role)
            if cell is None:
                continue
            for amount, hatched in ((cell.reported_tokens, False), (cell.estimated_tokens, True)):
                if amount <= 0:
                    continue
                estimated_any |= hatched
                kind = "estimated" if hatched else "reported"
                y_top, h = y(base + amount), plot_h * amount / y_max
                tip = escape(f"{day:%Y-%m-%d} {role}: {amount} tokens ({kind})")
                out.append(
                    f'<rect class="bar role-{escape(role)}" x="{x:.1f}" y="{y_top:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                    f'fill="{colors[role]}"><title>{tip}</title></rect>'
                )
                if hatched:
                    out.append(f'<rect x="{x:.1f}" y="{y_top:.1f}" width="{bar_w:.1f}" height="{h:.1f}" fill="url(#estimated-hatch)"/>')
                base += amount
        centre = x + bar_w / 2
        if totals[day]:
            out.append(f'<text class="total" x="{centre:.1f}" y="{y(base) - 4:.1f}" text-anchor="middle">{"~" if estimated_any else ""}{_short(totals[day])}</text>')
        if index % label_every == 0 or index == len(summary.days) - 1:
            out.append(f'<text class="day" x="{centre:.1f}" y="{top + plot_h + 14}" text-anchor="middle">{day:%m-%d}</text>')
        unknown = sum(r.unknown_calls for r in summary.rows if r.day == day)
        if unknown:
            out.append(
                f'<text class="unknown" x="{centre:.1f}" y="{top + plot_h + 27}" text-anchor="middle" fill="#a33">'
                f"?{unknown}<title>{unknown} call(s) on {day:%Y-%m-%d} with unknown usage (not in the bar)</title></text>"
            )
    out.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{top + plot_h + 44}" text-anchor="middle">day ({escape(str(settings.TIME_ZONE))})</text>'
    )
    legend_y, legend_x = height - 30, float(left)
    for role in summary.roles:
        out.append(f'<rect x="{legend_x:.1f}" y="{legend_y}" width="10" height="10" fill="{colors[role]}"/>')
        out.append(f'<text class="legend" x="{legend_x + 14:.1f}" y="{legend_y + 9}">{escape(role)}</text>')
        legend_x += 24 + 7 * len(role)
    out.append(f'<rect x="{legend_x:.1f}" y="{legend_y}" width="10" height="10" fill="#888"/>')
    out.append(f'<rect x="{legend_x:.1f}" y="{legend_y}" width="10" height="10" fill="url(#estimated-hatch)"/>')
    out.append(f'<text x="{legend_x + 14:.1f}" y="{legend_y + 9}">hatched: estimated here (~)</text>')
    out.append(
        f'<text x="{left}" y="{height - 6}" fill="#a33">?N under a day: N calls whose provider reported no usage '
        "(unknown, not counted as zero, not in the bars)</text>"
    )
    if not summary.rows:
        out.append(f'<text x="{left + plot_w / 2:.1f}" y="{top + plot_h / 2:.1f}" text-anchor="middle" fill="#666">no model calls in these days</text>')
    out.append("</svg>")
    return "\n".join(out)


def tokens_text(row: ModelUsage) -> str:
    """A call's tokens for a table cell, with their source: ``unknown`` when not reported."""
    if row.tokens_source == ModelUsage.TokensSource.UNKNOWN:
        return "unknown"
    mark = "~" if row.tokens_source == ModelUsage.TokensSource.ESTIMATED else ""
    parts = [f"in {mark}{row.input_tokens if row.input_tokens is not None else '?'}",
             f"out {mark}{row.output_tokens if row.output_tokens is not None else '?'}"]
    if row.cache_read_tokens is not None:
        parts.append(f"cache read {row.cache_read_tokens}")
    if row.cache_write_tokens is not None:
        parts.append(f"cache write {row.cache_write_tokens}")
    return f"{', '.join(parts)} ({row.tokens_source})"


def cost_text(row: ModelUsage) -> str:
    if row.cost is None:
        return "unknown"
    return f"{'~' if row.cost_source == ModelUsage.CostSource.ESTIMATED else ''}{row.cost.normalize():f} {row.currency} ({row.cost_source})"


def by_role_totals(rows: Iterable[DayRole]) -> dict[str, DayRole]:
    """The summary's rows added up per role (the day of each total is the earliest)."""
    totals: dict[str, DayRole] = {}
    for row in rows:
        total = totals.setdefault(row.role, DayRole(row.day, row.role))
        for name in ("calls", "failed", "reported_calls", "estimated_calls", "unknown_calls", "input_tokens", "output_tokens",
                     "cache_read_tokens", "cache_write_tokens", "reported_tokens", "estimated_tokens", "unpriced_calls",
                     "estimated_cost_calls"):
            setattr(total, name, getattr(total, name) + getattr(row, name))
        merged: defaultdict[str, Decimal] = defaultdict(Decimal, total.cost)
        for currency, amount in row.cost.items():
            merged[currency] += amount
        total.cost = dict(merged)
    return dict(sorted(totals.items()))
