"""Facts, worded only by the fixed templates: kinds, the template table, ids, the diff.

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

Rules:

1. Status and numbers are rendered from the fixed templates in ``TEMPLATES`` (one small
   table, keyed by fact kind and variant, never by tool). Each template has a text version
   and a shorter voice version. The only tool-specific part is the ``tool_label`` slot.
   An effect is worded by its verification and, where the proof means something else for
   it, its category: a ``service_ack`` of a send is the server's acceptance, never the
   recipient's; of the owner's data, a save.
2. Two audiences: ``text``/``voice`` are the owner's (reply facts, activity cards) and say
   what happened; ``model_text`` is the model's (its tool results) and may add what to do
   next ("do not repeat", "check with X before retrying"). No owner wording is an
   instruction; a fact whose owner wording is empty is the model's only.
3. A fact's id is stable: ``sha256(key, kind, canonical content)[:16]``. ``key`` names the
   call (task id / call id), so the same fact of the same call always has the same id and
   equal facts of two calls have different ids.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

FACT_KINDS = ("status", "effects", "values", "unknowns", "next", "diff")
STATUSES = ("succeeded", "partial", "failed", "unknown", "waiting", "running", "queued", "cancelled", "rejected")
VERIFICATIONS = ("verified", "service_ack", "not_verified", "unknown")

# ---------------------------------------------------------------------------------------
# The template table: the only place where fact sentences are worded, for two audiences.
#
# ``owner`` and ``voice`` are what a person reads or hears: reply facts, activity cards,
# notices. They state what happened and what the protocol proved, never what to do next.
# ``model`` is what the model reads in its tool results, when it needs more than the owner
# does: an instruction ("do not repeat", "check with X before retrying"). None: the model
# reads the owner's wording. An empty ``owner`` makes the fact the model's only: it is never
# shown to a person (a retry rule after a success tells the owner nothing new).
#
# Key "kind.variant" (effects: "effects.verification" or "effects.verification.category").
# Slots: tool_label, verb, target, name, value, unit, item, check_with. Every text ends with
# a sentence mark so facts can be concatenated.
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Wording:
    owner: str
    voice: str
    model: str | None = None


TEMPLATES: dict[str, Wording] = {
    "status.succeeded": Wording("「{tool_label}」已完成。", "办好了。"),
    "status.partial": Wording("「{tool_label}」只完成了一部分。", "只办好了一部分。"),
    "status.failed": Wording("「{tool_label}」没有成功。", "没办成。"),
    "status.unknown": Wording("「{tool_label}」结果还不清楚。", "结果还不清楚。", model="「{tool_label}」结果还不清楚，要先核查。"),
    "status.waiting": Wording("「{tool_label}」在等你确认，本次未执行。", "在等你确认。"),
    "status.running": Wording("「{tool_label}」还在办。", "还在办。"),
    "status.queued": Wording("「{tool_label}」排上队了，还在办。", "还在办。"),
    "status.cancelled": Wording("「{tool_label}」已取消，没有执行。", "已取消。"),
    "status.rejected": Wording("「{tool_label}」被拦下了，没有执行。", "没有执行。"),
    # Effects claim only what the verification proved: ``verified`` was read back;
    # ``service_ack`` is the service's word that it accepted the change — for a send, that
    # the server took the message (not that anyone received it), for the owner's data, that
    # the change was saved. A send is only ever a ``service_ack`` (``capabilities.receipts``
    # rule 6); that it arrived, or was read, is its own ``verified`` effect (action
    # ``deliver`` or ``seen``), and with it the send is worded without the doubt.
    "effects.verified": Wording("已{verb} {target}，已核实。", "已{verb}{target}。"),
    "effects.service_ack": Wording("已{verb} {target}，服务已确认接受。", "已{verb}{target}。"),
    "effects.service_ack.send": Wording("{target}：已交给服务器，是否送达还不知道。", "已交给服务器，还不知道是否送达。"),
    "effects.service_ack.owner_data": Wording("已{verb} {target}，已保存。", "已保存。"),
    "effects.not_verified": Wording("{verb} {target} 还没有核实。", "{target}还没核实。"),
    "effects.unknown": Wording("不清楚 {target} 是否已{verb}。", "{target}情况不明。"),
    "values.number": Wording("{name}：{value} {unit}。", "{name}{value}{unit}。"),
    "values.text": Wording("{name}：{value}。", "{name}{value}。"),
    "unknowns.item": Wording("还不清楚：{item}。", "不清楚{item}。"),
    "next.forbidden_done": Wording("", "", model="这项操作已经成功，不要重复。"),
    "next.forbidden": Wording("「{tool_label}」不会自动重试。", "不会重试。", model="「{tool_label}」不能重试。"),
    "next.after_check": Wording("核查结果之前不会再试。", "先核查再说。", model="重试前要先核查结果。"),
    "next.after_check_with": Wording("核查结果之前不会再试。", "先核查再说。", model="重试前要先用「{check_with}」核查。"),
    "next.after_check_done": Wording("", "", model="重试前要先核查结果。"),
    "next.after_check_with_done": Wording("", "", model="重试前要先用「{check_with}」核查。"),
    "next.allowed_after_failure": Wording("「{tool_label}」可以再试一次。", "可以再试。"),
    "next.waiting_owner": Wording("要等你确认后才会执行。", "等你确认。"),
    "next.waiting_service": Wording("在等对方服务回应。", "在等对方回应。"),
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
    "deliver": "送达",
    "seen": "确认已读",
    "move": "移动",
    "rename": "重命名",
    "read": "读取",
    "schedule": "安排",
    "cancel": "取消",
    "pay": "支付",
    "book": "预订",
    "save": "保存",
    "commit": "记下",
    "forget": "忘掉",
    "erase": "抹去",
    "add": "加入",
    "open": "打开",
    "set": "设置",
    "run": "运行",
    "draft": "起草",
}

# The actions of a ``verified`` effect that read a message back at the recipient's end
# (``claims.PROOF_CLAIMS``): the same target's send is then worded without doubt.
READ_BACK_ACTIONS = frozenset({"deliver", "seen"})


@dataclass(frozen=True)
class Fact:
    """One fact, rendered from a fixed template.

    ``id`` is ``sha256(key, kind, canonical content)`` in hex, first 16 characters.
    ``text`` is the written version for the owner, ``voice`` the shorter spoken one (both
    "" for a fact only the model reads: ``for_owner`` is False); ``model_text`` is the
    model's version, which may carry an instruction the owner never sees. The remaining
    fields are the structured data the checker compares against (``number``/``unit`` for
    numeric values, ``status`` for status facts, ``target``/``verification`` for effects).
    """

    id: str
    kind: str
    text: str
    voice: str
    key: str
    template: str
    model_text: str = ""
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

    @property
    def for_owner(self) -> bool:
        """Whether a person is ever shown this fact (else it is the model's only)."""
        return bool(self.text)


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
    wording = TEMPLATES[template]
    text = wording.owner.format(**slots)
    return Fact(
        id=fact_id(key, kind, {"template": template, **content}),
        kind=kind,
        text=text,
        voice=wording.voice.format(**slots),
        key=key,
        template=template,
        model_text=wording.model.format(**slots) if wording.model is not None else text,
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

    effects = receipt.get("effects") or []
    read_back = {str(e.get("target", "")) for e in effects
                 if e.get("verification") == "verified" and str(e.get("action", "")).lower() in READ_BACK_ACTIONS}
    for eff in effects:
        verification = eff.get("verification") if eff.get("verification") in VERIFICATIONS else "unknown"
        action = str(eff.get("action", ""))
        target = str(eff.get("target", ""))
        verb = ACTION_VERBS.get(action.lower(), action)
        template = f"effects.{verification}.{eff.get('category')}"
        if target in read_back:
            template = f"effects.{verification}"  # it arrived: the send's doubt is answered
        facts.append(
            _make(
                key,
                "effects",
                template if template in TEMPLATES else f"effects.{verification}",
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
        variants.append(("next.after_check_with" if check_with else "next.after_check") + ("_done" if status == "succeeded" else ""))
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
