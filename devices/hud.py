"""The glasses' HUD (docs/protocol.md "Glasses: HUD cards and gestures").

- **Short form**: every ``consent.card``, ``payment.card`` and ``activity`` frame sent to
  a glasses device carries ``hud``, at most ``HUD_CARD_MAX_CHARS`` (40) characters, ending
  with "…" when cut (``short_form``). Other devices get the frames unchanged.
- **Gestures**: a ``gesture`` frame (``confirm`` = nod, ``dismiss`` = shake) from the
  owner's glasses answers the card it names where the card allows it (``answer_gesture``):
  a consent card is approved or denied, signed by the glasses exactly like a
  ``consent.answer`` (``consent.services.card_message``); a payment is never paid by a nod
  (``payment_needs_phone``: it needs a fresh authorization on the phone) and a shake only
  hides it on the glasses; an activity card can only be dismissed.
- **Riding**: a ``device.state`` frame reports ``riding`` (``report_state``, the only code that
  writes ``DeviceState``); while the device's last report
  says it rides, every gesture is refused (``gesture_while_riding``) and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils import timezone

from accounts.models import Device
from consent import services as consent
from devices.models import DeviceState
from payments.models import PaymentAuthorization
from yimi_project.errors import YimiError
from yimi_project.ids import uuid_or_nil
from yimi_project.logs import log_event

GESTURES = {"confirm": "approve", "dismiss": "deny"}  # nod, shake → the consent answer
CARD_KINDS = ("consent", "payment", "activity")
CATEGORY_LABEL = {
    "send": "发送给", "owner_data": "修改", "account": "账号操作", "delete": "删除", "physical": "操作设备",
    "spend": "花钱", "self_change": "修改依米", "workspace": "写入", "observe": "读取",
}
STATUS_LABEL = {
    "succeeded": "办好了", "partial": "部分完成", "failed": "失败", "unknown": "结果未知", "waiting": "等你确认",
    "running": "进行中", "queued": "排队中", "cancelled": "已取消", "rejected": "被拒绝",
}


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def short_form(frame: dict[str, Any]) -> str:
    """The card in at most ``HUD_CARD_MAX_CHARS`` characters: what it asks, and the
    gesture that answers it (consent), or where to answer it (payment: the phone)."""
    limit = settings.HUD_CARD_MAX_CHARS
    kind = frame.get("type")
    if kind == "consent.card":
        tail = " 点头同意/摇头拒绝"
        what = f"{CATEGORY_LABEL.get(str(frame.get('category')), str(frame.get('category')))} {frame.get('target') or frame.get('tool') or ''}"
        return _cut(what, limit - len(tail)) + tail
    if kind == "payment.card":
        tail = " 请在手机上确认"
        what = f"付款{frame.get('amount')}{frame.get('currency') or ''} {frame.get('payee') or ''}"
        return _cut(what, limit - len(tail)) + tail
    if kind == "activity":
        status = STATUS_LABEL.get(str(frame.get("status")), str(frame.get("status")))
        tail = f"：{status}"
        return _cut(str(frame.get("title") or ""), limit - len(tail)) + tail
    return _cut(str(frame.get("text") or ""), limit)


def with_hud(device: Device | None, frame: dict[str, Any]) -> dict[str, Any]:
    """``frame`` with its ``hud`` short form when ``device`` is glasses; unchanged otherwise."""
    if device is None or device.kind != Device.Kind.GLASSES:
        return frame
    return {**frame, "hud": short_form(frame)}


# --- the device's state ---------------------------------------------------------------------------


def report_state(device: Device, frame: dict[str, Any]) -> DeviceState:
    """Record what the device says about itself (``riding``: true or false)."""
    riding = frame.get("riding")
    if not isinstance(riding, bool):
        raise YimiError("invalid_frame", "riding must be true or false")
    state, _ = DeviceState.objects.update_or_create(device=device, defaults={"riding": riding, "reported_at": timezone.now()})
    log_event("device_state", device_id=str(device.id), riding=riding)
    return state


def is_riding(device: Device) -> bool:
    return DeviceState.objects.filter(device=device, riding=True).exists()


# --- gestures ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GestureOutcome:
    card_kind: str
    card_id: str
    gesture: str
    effect: str  # approved | denied | dismissed (only on the glasses)
    state: str  # the card's state after it (the consent card's; a payment's is unchanged)
    card: Any = None  # the consent card, when one was answered


def answer_gesture(device: Device, frame: dict[str, Any]) -> GestureOutcome:
    """A nod or a shake from the owner's glasses, on one card.

    Steps: 1. a valid gesture and card kind (``invalid_frame``); 2. the owner's glasses
    only (``forbidden``); 3. not while the device reports riding (``gesture_while_riding``);
    4. by card kind — consent: ``consent.services.answer_card`` with approve (nod) or deny
    (shake), the signature over the card and that answer checked there (so a bad or missing
    signature, an expired or answered card change nothing, with the same codes as
    ``consent.answer``); payment: a nod is ``payment_needs_phone`` (a payment needs a fresh
    authorization on the phone, never a gesture), a shake hides it on the glasses and the
    card stays open on the phone; activity: a shake hides it, a nod is
    ``gesture_not_allowed``. Every refusal changes nothing."""
    gesture, card_kind, card_id = frame.get("gesture"), frame.get("card_kind"), frame.get("card_id")
    # A list or an object is no more a gesture than "wave" is (and cannot be looked up).
    if not isinstance(gesture, str) or gesture not in GESTURES:
        raise YimiError("invalid_frame", "gesture must be confirm (nod) or dismiss (shake)")
    if not isinstance(card_kind, str) or card_kind not in CARD_KINDS:
        raise YimiError("invalid_frame", "card_kind must be consent, payment or activity")
    if not isinstance(card_id, str) or not card_id:
        raise YimiError("invalid_frame", "card_id must name the card")
    if device.is_guest or device.kind != Device.Kind.GLASSES:
        raise YimiError("forbidden", "only the owner's glasses answer cards with gestures")
    if is_riding(device):
        raise YimiError("gesture_while_riding", "gestures are off while riding; nothing was answered")
    if card_kind == "consent":
        card = consent.answer_card(device, card_id, GESTURES[gesture], frame.get("signature"))
        log_event("gesture_answered", device_id=str(device.id), card_kind=card_kind, gesture=gesture)
        return GestureOutcome(card_kind, str(card.id), gesture, str(card.state), str(card.state), card)
    if card_kind == "payment":
        auth = PaymentAuthorization.objects.filter(id=uuid_or_nil(card_id), intent__owner_id=device.owner_id).first()
        if auth is None:
            raise YimiError("not_found", "there is no such payment card")
        if gesture == "confirm":
            raise YimiError("payment_needs_phone", "a payment needs a fresh authorization on the phone; a nod pays nothing")
        return GestureOutcome(card_kind, str(auth.id), gesture, "dismissed", str(auth.state))
    if gesture == "confirm":
        raise YimiError("gesture_not_allowed", "an activity card has nothing to confirm; shake to dismiss it")
    return GestureOutcome(card_kind, card_id, gesture, "dismissed", "")
