"""The shop pack: 奶茶小铺, a simulated store with a real checkout state machine.

The store lives in ``$YIMI_PACKS_DATA_DIR/shop/store.json`` (without that variable, in
``packs/shop`` next to ``YIMI_WORKSPACE_DIR``, which is how the platform lays its data
directory out). It is created with the default merchant, menu and ETA when missing; every
call reads and writes it under an exclusive lock (``store.lock``) and writes atomically
(temporary file, fsync, rename), so several hosts can share it.

Checkout states: ``cart`` → ``checkout`` (the page is open for one payment intent, with
the amount read at the page) → ``paid``. Changing the cart leaves an open checkout page.

- ``checkout`` without a ``payment_intent_id`` is the CheckoutStop: it refuses to enter the
  checkout (``failed`` / ``checkout_stop``), reports what the order would be and changes
  nothing.
- ``pay`` needs the open page for the same intent and an authorization id never used
  before. It reads the amount back from the page; a pending price drift (``price_drift``,
  seeded from ``YIMI_SHOP_PRICE_DRIFT`` when the store is created) is applied at that
  moment. If the amount differs from ``authorized_amount`` it pays nothing
  (``AMOUNT_CHANGED``) and the authorization is used up (voided); otherwise the order is
  placed, the authorization used, the cart emptied.

Amounts: ``values`` in unit ``yuan`` (floats, 2 decimals); the exact decimal strings are
in ``content``. The fake (``fake/tools.py``) runs these same handlers on an in-memory store.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from capabilities.packkit import ToolRegistry, effect, receipt, value

TOOLS = ToolRegistry()
MERCHANT = "奶茶小铺"
PAYEE = "milk-tea-shop"
CURRENCY = "CNY"
ETA = "25 分钟"
MENU = {"珍珠奶茶": "18.00", "杨枝甘露": "22.00", "芝士葡萄": "25.00", "柠檬绿茶": "12.50"}
DRIFT_ENV = "YIMI_SHOP_PRICE_DRIFT"
MAX_QUANTITY = 20
MAX_ID = 128
CENT = Decimal("0.01")
SOURCE_MENU = "奶茶小铺 menu"
SOURCE_CART = "奶茶小铺 cart"
SOURCE_PAGE = "奶茶小铺 checkout page"
SOURCE_ORDERS = "奶茶小铺 orders"
STORE_FILE = "store.json"
LOCK_FILE = "store.lock"

PLATFORM_FIELD = "set by the platform; never fill it in yourself"
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
ADD_SCHEMA = {
    "type": "object",
    "properties": {
        "item": {"type": "string", "description": "the exact name of a menu item, e.g. 珍珠奶茶"},
        "quantity": {"type": "integer", "minimum": 1, "maximum": MAX_QUANTITY},
    },
    "required": ["item", "quantity"],
}
CHECKOUT_SCHEMA = {
    "type": "object",
    "properties": {
        "owner_requested": {"type": "boolean", "description": "true only when the owner asked to order"},
        "payment_intent_id": {"type": "string", "maxLength": MAX_ID, "description": PLATFORM_FIELD},
    },
}
PAY_SCHEMA = {
    "type": "object",
    "properties": {
        "payment_intent_id": {"type": "string", "maxLength": MAX_ID, "description": PLATFORM_FIELD},
        "payment_authorization_id": {"type": "string", "maxLength": MAX_ID, "description": PLATFORM_FIELD},
        "authorized_amount": {"type": ["string", "number"], "description": PLATFORM_FIELD},
    },
}


class StoreError(Exception):
    """The store could not be read."""


# --- the store ----------------------------------------------------------------------------


def parse_drift(text: str | None) -> list[str]:
    """``"2.00, -1.5"`` → ``["2.00", "-1.50"]``; entries that are not amounts are ignored."""
    drift = []
    for part in (text or "").split(","):
        amount = decimal_or_none(part.strip())
        if amount is not None:
            drift.append(money(amount))
    return drift


def default_store(drift: list[str] | None = None) -> dict[str, Any]:
    return {
        "merchant": {"name": MERCHANT, "payee": PAYEE},
        "currency": CURRENCY,
        "menu": dict(MENU),
        "eta": ETA,
        "cart": [],  # [{"item": name, "quantity": n}], in the order first added
        "checkout": {"state": "cart", "payment_intent_id": None, "amount": None, "adjustment": "0.00"},
        "orders": [],
        "used_authorizations": [],
        "price_drift": list(drift or []),
    }


def _checked(data: Any) -> dict[str, Any]:
    required = {"merchant": dict, "menu": dict, "eta": str, "cart": list, "checkout": dict, "orders": list, "used_authorizations": list}
    if not isinstance(data, dict) or any(not isinstance(data.get(k), t) for k, t in required.items()):
        raise StoreError("the store does not have the expected structure")
    data.setdefault("currency", CURRENCY)
    data.setdefault("price_drift", [])
    data["checkout"].setdefault("adjustment", "0.00")
    return data


class FileStore:
    """The real store: one JSON file, shared by every host through a lock file."""

    def directory(self) -> Path:
        base = os.environ.get("YIMI_PACKS_DATA_DIR")
        root = Path(base) if base else Path(os.environ.get("YIMI_WORKSPACE_DIR", "workspace")).resolve().parent / "packs"
        directory = root.resolve() / "shop"
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    @contextmanager
    def locked(self) -> Iterator[None]:
        with open(self.directory() / LOCK_FILE, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def load(self) -> dict[str, Any]:
        """Read the store (call it under ``locked``); create it when missing."""
        path = self.directory() / STORE_FILE
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            store = default_store(parse_drift(os.environ.get(DRIFT_ENV)))
            self.save(store)
            return store
        except OSError as exc:
            raise StoreError(f"cannot read {STORE_FILE} ({type(exc).__name__})") from None
        try:
            return _checked(json.loads(text))
        except ValueError as exc:
            raise StoreError(f"{STORE_FILE} is not valid JSON ({exc})") from None

    def save(self, store: dict[str, Any]) -> None:
        directory = self.directory()
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".store-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(store, fh, ensure_ascii=False, indent=1)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, directory / STORE_FILE)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


class MemoryStore:
    """The fake's store: the same structure in a dict it is given (module state)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state
        self.lock = threading.RLock()

    @contextmanager
    def locked(self) -> Iterator[None]:
        with self.lock:
            yield

    def load(self) -> dict[str, Any]:
        return _checked(copy.deepcopy(self.state))

    def save(self, store: dict[str, Any]) -> None:
        self.state.clear()
        self.state.update(copy.deepcopy(store))


STORE: FileStore | MemoryStore = FileStore()  # the fake replaces it with a MemoryStore


# --- amounts and views ----------------------------------------------------------------------


def decimal_or_none(raw: Any) -> Decimal | None:
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        return None
    try:
        amount = Decimal(str(raw).strip())
    except (InvalidOperation, ValueError):
        return None
    return amount if amount.is_finite() else None


def money(amount: Decimal) -> str:
    return str(amount.quantize(CENT))


def yuan(amount: Decimal) -> float:
    return round(float(amount), 2)


def cart_lines(store: dict[str, Any]) -> list[dict[str, Any]]:
    lines = []
    for line in store["cart"]:
        price = Decimal(store["menu"][line["item"]])
        lines.append({"item": line["item"], "quantity": line["quantity"], "unit_price": money(price), "line_total": money(price * line["quantity"])})
    return lines


def cart_total(store: dict[str, Any]) -> Decimal:
    return sum((Decimal(store["menu"][line["item"]]) * line["quantity"] for line in store["cart"]), Decimal("0.00"))


def item_count(store: dict[str, Any]) -> int:
    return sum(line["quantity"] for line in store["cart"])


def describe(store: dict[str, Any], amount: Decimal) -> str:
    listed = "，".join(f"{line['item']} ×{line['quantity']}" for line in store["cart"]) or "（空）"
    return f"{store['merchant']['name']}（{store['merchant']['payee']}）：{listed}；合计 {money(amount)} 元；预计 {store['eta']}送达"


def order_view(store: dict[str, Any], amount: Decimal, intent_id: str | None) -> dict[str, Any]:
    """What the checkout page shows (or would show): merchant, payee, items, amount, ETA."""
    return {
        "merchant": store["merchant"]["name"],
        "payee": store["merchant"]["payee"],
        "items": cart_lines(store),
        "amount": money(amount),
        "currency": store["currency"],
        "eta": store["eta"],
        "payment_intent_id": intent_id,
        "text": describe(store, amount),
    }


def leave_checkout(store: dict[str, Any]) -> None:
    store["checkout"] = {"state": "cart", "payment_intent_id": None, "amount": None, "adjustment": "0.00"}


def refuse(code: str, message: str, *, retry: str = "forbidden", values: list[dict[str, Any]] | None = None,
           content: dict[str, Any] | None = None) -> dict[str, Any]:
    return receipt("failed", summary=message, retry=retry, error=(code, message), values=values, content=content)


def unreadable(exc: Exception) -> dict[str, Any]:
    return refuse("store_unavailable", f"the store could not be read; nothing changed ({exc})", retry="allowed")


def lost(exc: Exception, what: str, check_with: str) -> dict[str, Any]:
    return receipt("unknown", summary=f"the store failed while saving; {what} may or may not have happened",
                   unknowns=[f"whether {what} happened ({type(exc).__name__})"], retry="after_check", check_with=check_with,
                   error=("store_failed", str(exc)[:500]))


def valid_id(raw: Any) -> bool:
    return isinstance(raw, str) and 0 < len(raw) <= MAX_ID and raw.strip() == raw and "\n" not in raw


# --- tools ---------------------------------------------------------------------------------


@TOOLS("Show 奶茶小铺's menu with prices (yuan), the merchant, the delivery ETA and the cart.", EMPTY_SCHEMA)
def browse(args: dict[str, Any]) -> dict[str, Any]:
    try:
        with STORE.locked():
            store = STORE.load()
    except (StoreError, OSError) as exc:
        return unreadable(exc)
    menu = [{"item": name, "price": money(Decimal(price))} for name, price in store["menu"].items()]
    total = cart_total(store)
    text = f"{store['merchant']['name']}（{store['merchant']['payee']}），预计 {store['eta']}送达。" + "；".join(f"{m['item']} {m['price']} 元" for m in menu)
    return receipt(
        "succeeded",
        summary=f"{store['merchant']['name']}: {len(menu)} items on the menu, {item_count(store)} in the cart",
        values=[
            value("menu_item_count", len(menu), "item", SOURCE_MENU),
            value("cart_item_count", item_count(store), "item", SOURCE_CART),
            value("cart_total", yuan(total), "yuan", SOURCE_CART),
        ],
        content={
            "merchant": store["merchant"]["name"], "payee": store["merchant"]["payee"], "eta": store["eta"],
            "currency": store["currency"], "items": menu, "cart": cart_lines(store), "cart_total": money(total),
            "checkout_state": store["checkout"]["state"], "text": text,
        },
    )


@TOOLS("Add a menu item (its exact name) to the cart, quantity 1 to 20. Changing the cart leaves an open checkout page.", ADD_SCHEMA)
def add_to_cart(args: dict[str, Any]) -> dict[str, Any]:
    name, quantity = args.get("item"), args.get("quantity")
    if isinstance(quantity, bool) or not isinstance(quantity, int) or not 1 <= quantity <= MAX_QUANTITY:
        return refuse("invalid_quantity", f"quantity must be a whole number from 1 to {MAX_QUANTITY}")
    try:
        with STORE.locked():
            store = STORE.load()
            if not isinstance(name, str) or name not in store["menu"]:
                menu = [{"item": n, "price": money(Decimal(p))} for n, p in store["menu"].items()]
                return refuse("unknown_item", f"{name!r} is not on the menu of {store['merchant']['name']}", content={"items": menu})
            line = next((entry for entry in store["cart"] if entry["item"] == name), None)
            if line is None:
                line = {"item": name, "quantity": 0}
                store["cart"].append(line)
            line["quantity"] += quantity
            expected = line["quantity"]
            leave_checkout(store)  # the cart changed: an open checkout page is stale
            try:
                STORE.save(store)
                back = STORE.load()
            except (StoreError, OSError) as exc:
                return lost(exc, f"adding {name} ×{quantity} to the cart", "browse")
    except (StoreError, OSError) as exc:
        return unreadable(exc)
    verified = any(e["item"] == name and e["quantity"] == expected for e in back["cart"]) and back["checkout"]["state"] == "cart"
    total = cart_total(back)
    values = [
        value("quantity", expected, "item", SOURCE_CART),
        value("cart_item_count", item_count(back), "item", SOURCE_CART),
        value("cart_total", yuan(total), "yuan", SOURCE_CART),
    ]
    content = {"items": cart_lines(back), "cart_total": money(total), "currency": back["currency"]}
    if not verified:
        return receipt("unknown", summary=f"added {name} ×{quantity} but the cart did not read back", effects=[effect("cart", "add", "not_verified")],
                       values=values, content=content, unknowns=["what the cart holds"], retry="after_check", check_with="browse")
    return receipt("succeeded", summary=f"added {name} ×{quantity}; the cart holds {item_count(back)} items, {money(total)} yuan",
                   effects=[effect("cart", "add", "verified")], values=values, content=content, retry="after_check", check_with="browse")


@TOOLS(
    "Open the checkout page for the cart and read back the amount, payee, items and ETA. Set owner_requested: true only when "
    "the owner asked to order. Without a payment intent (the platform's) it stops before the checkout. It never pays.",
    CHECKOUT_SCHEMA,
)
def checkout(args: dict[str, Any]) -> dict[str, Any]:
    intent = args.get("payment_intent_id")
    if intent not in (None, "") and not valid_id(intent):
        return refuse("invalid_request", "payment_intent_id must be one line of at most 128 characters")
    try:
        with STORE.locked():
            store = STORE.load()
            if not store["cart"]:
                return refuse("empty_cart", "the cart is empty: add something before the checkout", retry="allowed")
            page = store["checkout"]
            amount = cart_total(store) + Decimal(page["adjustment"])
            if not intent:
                view = order_view(store, amount, None)
                values = [value("amount", yuan(amount), "yuan", SOURCE_CART), value("item_count", item_count(store), "item", SOURCE_CART)]
                message = f"stopped before the checkout: there is no payment intent. The order would be {view['text']}"
                return refuse("checkout_stop", message, retry="allowed", values=values, content=view)
            store["checkout"] = {"state": "checkout", "payment_intent_id": intent, "amount": money(amount), "adjustment": page["adjustment"]}
            try:
                STORE.save(store)
                back = STORE.load()
            except (StoreError, OSError) as exc:
                return lost(exc, "opening the checkout page", "order_status")
    except (StoreError, OSError) as exc:
        return unreadable(exc)
    page = back["checkout"]
    verified = page["state"] == "checkout" and page["payment_intent_id"] == intent and page["amount"] is not None
    read = Decimal(page["amount"]) if page["amount"] is not None else amount
    view = {**order_view(back, read, intent), "state": page["state"]}
    values = [value("amount", yuan(read), "yuan", SOURCE_PAGE), value("item_count", item_count(back), "item", SOURCE_PAGE)]
    if not verified:
        return receipt("unknown", summary="opened the checkout page but it did not read back", effects=[effect("checkout", "open", "not_verified")],
                       values=values, content=view, unknowns=["whether the checkout page is open"], retry="after_check", check_with="order_status")
    return receipt("succeeded", summary=f"at the checkout (not paid): {view['text']}", effects=[effect("checkout", "open", "verified")],
                   values=values, content=view, retry="allowed")


@TOOLS(
    "Pay at the open checkout with the owner's authorization (the platform supplies it). Pays only if the amount read back at "
    "the checkout equals the authorized amount; otherwise fails with AMOUNT_CHANGED and pays nothing.",
    PAY_SCHEMA,
)
def pay(args: dict[str, Any]) -> dict[str, Any]:
    intent, authorization = args.get("payment_intent_id"), args.get("payment_authorization_id")
    if authorization in (None, ""):
        return refuse("no_authorization", "there is no authorization for this payment; nothing was paid")
    if not valid_id(authorization):
        return refuse("invalid_request", "payment_authorization_id must be one line of at most 128 characters; nothing was paid")
    authorized = decimal_or_none(args.get("authorized_amount"))
    if authorized is None or authorized <= 0 or authorized != authorized.quantize(CENT):
        return refuse("invalid_amount", "authorized_amount must be a positive amount in yuan with at most 2 decimals; nothing was paid")
    try:
        with STORE.locked():
            store = STORE.load()
            if authorization in store["used_authorizations"]:
                return refuse("authorization_reused", "this authorization was already used; nothing was paid")
            page = store["checkout"]
            if page["state"] != "checkout" or not intent or page["payment_intent_id"] != intent:
                return refuse("not_at_checkout", "the checkout page is not open for this payment intent; nothing was paid")
            # Read the amount back from the page; a price that changes at the checkout shows here.
            amount = Decimal(page["amount"])
            if store["price_drift"]:
                drift = Decimal(store["price_drift"].pop(0))
                amount += drift
                page["adjustment"] = money(Decimal(page["adjustment"]) + drift)
                page["amount"] = money(amount)
            store["used_authorizations"].append(authorization)  # one-shot: used, or voided below
            view = order_view(store, amount, intent)
            if amount != authorized:
                try:
                    STORE.save(store)
                except OSError as exc:
                    return lost(exc, "voiding the authorization", "order_status")
                message = (f"the checkout amount is {money(amount)} yuan, not the authorized {money(authorized)} yuan; "
                           "nothing was paid and this authorization is void")
                return refuse(
                    "AMOUNT_CHANGED", message, retry="allowed",
                    values=[value("checkout_amount", yuan(amount), "yuan", SOURCE_PAGE), value("authorized_amount", yuan(authorized), "yuan", "the owner's authorization")],
                    content={**view, "checkout_amount": money(amount), "authorized_amount": money(authorized), "authorization_voided": True},
                )
            order = {
                "order_id": f"SO-{uuid.uuid4().hex[:12].upper()}",
                "amount": money(amount),
                "currency": store["currency"],
                "state": "paid",
                "merchant": view["merchant"],
                "payee": view["payee"],
                "items": view["items"],
                "eta": view["eta"],
                "payment_intent_id": intent,
                "payment_authorization_id": authorization,
                "created_at": datetime.now(UTC).replace(microsecond=0).isoformat(),
            }
            store["orders"].append(order)
            store["cart"] = []
            store["checkout"] = {"state": "paid", "payment_intent_id": intent, "amount": money(amount), "adjustment": "0.00"}
            try:
                STORE.save(store)
                back = STORE.load()
            except (StoreError, OSError) as exc:
                return lost(exc, f"the payment of {money(amount)} yuan", "order_status")
    except (StoreError, OSError) as exc:
        return unreadable(exc)
    verified = (
        any(o.get("order_id") == order["order_id"] and o.get("amount") == order["amount"] for o in back["orders"])
        and authorization in back["used_authorizations"]
        and back["checkout"]["state"] == "paid"
    )
    values = [value("amount_paid", yuan(amount), "yuan", SOURCE_ORDERS), value("item_count", sum(i["quantity"] for i in order["items"]), "item", SOURCE_ORDERS)]
    content = {**view, "order_id": order["order_id"], "amount_paid": order["amount"], "state": "paid", "order": order,
               "text": f"paid order {order['order_id']}: {view['text']}"}
    if not verified:
        return receipt("unknown", summary=f"paid order {order['order_id']} but it did not read back", effects=[effect(order["order_id"], "pay", "not_verified")],
                       values=values, content=content, unknowns=["whether the order was placed"], retry="after_check", check_with="order_status")
    return receipt("succeeded", summary=f"paid {order['amount']} yuan to {order['merchant']}: order {order['order_id']}, arriving in about {order['eta']}",
                   effects=[effect(order["order_id"], "pay", "verified")], values=values, content=content, retry="forbidden")


@TOOLS("Show the last order: its id, amount and state (or that there is none).", EMPTY_SCHEMA)
def order_status(args: dict[str, Any]) -> dict[str, Any]:
    try:
        with STORE.locked():
            store = STORE.load()
    except (StoreError, OSError) as exc:
        return unreadable(exc)
    last = store["orders"][-1] if store["orders"] else None
    if last is None:
        return receipt("succeeded", summary="there is no order yet", content={"order_id": None, "state": None, "amount": None, "items": [],
                       "checkout_state": store["checkout"]["state"], "text": "no order yet"})
    summary = f"order {last['order_id']}: {last['amount']} yuan, {last['state']}"
    return receipt(
        "succeeded", summary=summary,
        values=[value("amount", yuan(Decimal(last["amount"])), "yuan", SOURCE_ORDERS)],
        content={"order_id": last["order_id"], "state": last["state"], "amount": last["amount"], "items": [copy.deepcopy(last)],
                 "checkout_state": store["checkout"]["state"], "text": summary},
    )
