"""A scripted cloud phone: the REST API the phone pack speaks, over an in-memory world.

The same ``route(world, method, path, body)`` answers the pack's fake (in process) and the
tests' local HTTP server (``tests/support/cloud_phone_fake.py``), so both speak one API:

    GET    /v1/devices                                   → {"devices": [{"id", "state", "leased"}]}
    POST   /v1/devices/{id}/start | /stop                → {"device": {...}}
    POST   /v1/devices/{id}/leases      {"holder"}       → 201 {"lease_id", "device_id"} | 409 device_busy
    DELETE /v1/leases/{lease}                            → {"released": true} | 404 lease_lost
    GET    /v1/leases/{lease}/screen                     → {"screen": {...}}
    POST   /v1/leases/{lease}/tap       {"node"}         → {"screen": {...}} | 404 no_such_node
    POST   /v1/leases/{lease}/input     {"node", "text"} → {"screen": {...}}
    POST   /v1/leases/{lease}/launch    {"app"}          → {"screen": {...}} | 404 no_such_app
    POST   /v1/leases/{lease}/home                       → {"screen": {...}}
    POST   /v1/leases/{lease}/apps/{app}/login/save      → 201 {"snapshot_id", "app", "bytes"}
    POST   /v1/leases/{lease}/apps/{app}/login/restore {"snapshot_id"} → {"restored": true}

A screen is ``{"app", "page", "title", "nodes": [{"id", "role", "text", "resource_id"}]}``
(an accessibility tree, flattened). Errors are ``{"error": {"code", "message"}}``.

The world: a home screen with an app list (奶茶小铺, Notes); 奶茶小铺's menu, a cart, a
checkout page (收银台: merchant, items, amount, payee, ETA, 立即支付) and a paid page; Notes
with a new-note editor and a saved page. Tapping 立即支付 pays (``payments`` records it),
which is what the pack's CheckoutStop must prevent without the owner's authorization.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

APPS = {"milktea": "奶茶小铺", "notes": "Notes"}
MENU = {"item.oolong": ("乌龙奶茶", Decimal("18.00")), "item.jasmine": ("茉莉奶绿", Decimal("20.00"))}
MERCHANT, PAYEE, ETA = "奶茶小铺", "milk-tea-shop", "约30分钟"
MAX_TEXT = 2000


def node(node_id: str, text: str, role: str = "text", resource_id: str | None = None) -> dict[str, Any]:
    return {"id": node_id, "role": role, "text": text, "resource_id": resource_id or node_id}


@dataclass
class Device:
    id: str
    state: str = "running"
    lease: str | None = None
    app: str = ""
    page: str = "home"
    cart: list[str] = field(default_factory=list)
    draft: str = ""
    notes: list[str] = field(default_factory=list)
    logins: dict[str, str] = field(default_factory=dict)


class World:
    def __init__(self, devices: tuple[str, ...] = ("phone-1",)) -> None:
        self.devices = {d: Device(d) for d in devices}
        self.leases: dict[str, str] = {}  # lease id → device id
        self.snapshots: dict[str, tuple[str, str]] = {}  # snapshot id → (app, data)
        self.payments: list[dict[str, Any]] = []
        self.events: list[tuple[str, ...]] = []  # what happened, in order (the tests read it)
        self.lock = threading.RLock()

    # --- screens -------------------------------------------------------------------------------

    def total(self, d: Device) -> Decimal:
        return sum((MENU[i][1] for i in d.cart), Decimal("0.00"))

    def screen(self, d: Device) -> dict[str, Any]:
        if d.page == "home":
            nodes = [node(f"icon.{a}", name, "app_icon") for a, name in APPS.items()]
            return {"app": "", "page": "home", "title": "Home", "nodes": nodes}
        if d.page == "menu":
            nodes = [node(i, f"{name} ¥{price}", "button") for i, (name, price) in MENU.items()]
            nodes += [node("cart.count", f"购物车 {len(d.cart)} 件"), node("go_checkout", "去结算", "button", "btn_checkout")]
            return {"app": "milktea", "page": "menu", "title": MERCHANT, "nodes": nodes}
        if d.page == "checkout":
            items = "、".join(f"{MENU[i][0]} x1" for i in d.cart)
            nodes = [
                node("checkout.merchant", MERCHANT, resource_id="merchant"), node("checkout.items", items, resource_id="order_items"),
                node("checkout.amount", f"¥{self.total(d)}", resource_id="checkout_amount"),
                node("checkout.payee", PAYEE, resource_id="payee"), node("checkout.eta", ETA, resource_id="eta"),
                node("pay_now", "立即支付", "button", "btn_pay"), node("back", "返回", "button"),
            ]
            return {"app": "milktea", "page": "checkout", "title": "收银台", "nodes": nodes}
        if d.page == "paid":
            return {"app": "milktea", "page": "paid", "title": "支付成功", "nodes": [node("paid.amount", f"¥{self.total(d)}")]}
        if d.page == "notes":
            nodes = [node(f"note.{n}", text) for n, text in enumerate(d.notes)] + [node("note.new", "新建笔记", "button")]
            return {"app": "notes", "page": "notes", "title": "Notes", "nodes": nodes}
        if d.page == "editor":
            nodes = [node("note.body", d.draft, "input"), node("note.save", "保存", "button")]
            return {"app": "notes", "page": "editor", "title": "新建笔记", "nodes": nodes}
        return {"app": "notes", "page": "saved", "title": "已保存", "nodes": [node("note.saved", d.notes[-1] if d.notes else "")]}

    def tap(self, d: Device, node_id: str) -> bool:
        ids = {n["id"] for n in self.screen(d)["nodes"]}
        if node_id not in ids:
            return False
        if d.page == "home":
            d.app = node_id.removeprefix("icon.")
            d.page = "menu" if d.app == "milktea" else "notes"
        elif d.page == "menu" and node_id in MENU:
            d.cart.append(node_id)
        elif d.page == "menu" and node_id == "go_checkout" and d.cart:
            d.page = "checkout"
        elif d.page == "checkout" and node_id == "pay_now":
            self.payments.append({"device": d.id, "amount": str(self.total(d)), "payee": PAYEE})
            d.page = "paid"
        elif d.page == "checkout" and node_id == "back":
            d.page = "menu"
        elif d.page == "notes" and node_id == "note.new":
            d.page, d.draft = "editor", ""
        elif d.page == "editor" and node_id == "note.save":
            d.notes.append(d.draft)
            d.page = "saved"
        return True

    def launch(self, d: Device, app: str) -> None:
        d.app, d.page = app, ("menu" if app == "milktea" else "notes")


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, Any]]:
    return status, {"error": {"code": code, "message": message}}


def route(world: World, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
    """One API request against the world: (HTTP status, JSON body)."""
    body = body or {}
    parts = [p for p in path.split("?")[0].split("/") if p]
    if parts[:1] != ["v1"]:
        return _error(404, "not_found", "no such endpoint")
    parts = parts[1:]
    with world.lock:
        if method == "GET" and parts == ["devices"]:
            return 200, {"devices": [{"id": d.id, "state": d.state, "leased": d.lease is not None} for d in world.devices.values()]}
        if len(parts) == 3 and parts[0] == "devices":
            d = world.devices.get(parts[1])
            if d is None:
                return _error(404, "no_such_device", f"no device {parts[1]}")
            if method == "POST" and parts[2] in ("start", "stop"):
                if d.lease is not None and parts[2] == "stop":
                    return _error(409, "device_busy", "the device is leased")
                d.state = "running" if parts[2] == "start" else "stopped"
                world.events.append((parts[2], d.id))
                return 200, {"device": {"id": d.id, "state": d.state, "leased": d.lease is not None}}
            if method == "POST" and parts[2] == "leases":
                if d.lease is not None:
                    return _error(409, "device_busy", "the device is leased by another task")
                d.lease = f"lease-{uuid.uuid4().hex[:12]}"
                world.leases[d.lease] = d.id
                world.events.append(("lease", d.id, str(body.get("holder", ""))))
                return 201, {"lease_id": d.lease, "device_id": d.id}
        if len(parts) >= 2 and parts[0] == "leases":
            device_id = world.leases.get(parts[1])
            if device_id is None:
                return _error(404, "lease_lost", "no such lease (released or expired)")
            d = world.devices[device_id]
            rest = parts[2:]
            if method == "DELETE" and not rest:
                del world.leases[parts[1]]
                d.lease = None
                world.events.append(("release", d.id))
                return 200, {"released": True}
            if d.state != "running":
                return _error(409, "device_stopped", "the device is not running")
            if method == "GET" and rest == ["screen"]:
                return 200, {"screen": world.screen(d)}
            if method == "POST" and rest == ["tap"]:
                if not world.tap(d, str(body.get("node", ""))):
                    return _error(404, "no_such_node", "no such node on this screen")
                world.events.append(("tap", str(body.get("node"))))
                return 200, {"screen": world.screen(d)}
            if method == "POST" and rest == ["input"]:
                text = body.get("text")
                if body.get("node") != "note.body" or d.page != "editor" or not isinstance(text, str) or len(text) > MAX_TEXT:
                    return _error(404, "no_such_node", "no input field with that id on this screen")
                d.draft = text
                world.events.append(("input", "note.body"))
                return 200, {"screen": world.screen(d)}
            if method == "POST" and rest == ["launch"]:
                if body.get("app") not in APPS:
                    return _error(404, "no_such_app", "no such app installed")
                world.launch(d, str(body["app"]))
                return 200, {"screen": world.screen(d)}
            if method == "POST" and rest == ["home"]:
                d.app, d.page = "", "home"
                return 200, {"screen": world.screen(d)}
            if method == "POST" and len(rest) == 4 and rest[0] == "apps" and rest[2] == "login":
                app = rest[1]
                if app not in APPS:
                    return _error(404, "no_such_app", "no such app installed")
                if rest[3] == "save":
                    data = d.logins.get(app, f"session-of-{app}")
                    snapshot = f"snap-{uuid.uuid4().hex[:12]}"
                    world.snapshots[snapshot] = (app, data)
                    world.events.append(("login_save", app))
                    return 201, {"snapshot_id": snapshot, "app": app, "bytes": len(data.encode())}
                if rest[3] == "restore":
                    saved = world.snapshots.get(str(body.get("snapshot_id", "")))
                    if saved is None or saved[0] != app:
                        return _error(404, "no_such_snapshot", "no saved login data with that id for this app")
                    d.logins[app] = saved[1]
                    world.events.append(("login_restore", app))
                    return 200, {"restored": True, "app": app}
    return _error(404, "not_found", "no such endpoint")


# --- a scripted executor model for this world (the fake's model and the tests') ------------------


def scripted_answer(messages: list[dict[str, Any]]) -> str:
    """The next action for the goal and screen in the last user message, as a model would
    answer it (one JSON object). Deterministic: goals about notes write a note, goals about
    奶茶/milk tea add the first drink and go to the checkout; a goal containing "wander"
    taps back and forth forever (for the step and time limits); "give up" fails."""
    try:
        ask = json.loads(messages[-1]["content"])
    except (ValueError, KeyError, IndexError, TypeError):
        return "I cannot read the request."
    goal, screen = str(ask.get("goal", "")), ask.get("screen") or {}
    page = screen.get("page")

    def act(**action: Any) -> str:
        return json.dumps(action, ensure_ascii=False)

    if "give up" in goal:
        return act(action="fail", reason="the scripted model gives up")
    if "wander" in goal:
        return act(action="launch", app="notes") if page != "notes" else act(action="launch", app="milktea")
    if page == "home":
        return act(action="tap", node="icon.notes" if "note" in goal.lower() else "icon.milktea")
    if page == "menu":
        count = next((n["text"] for n in screen.get("nodes", []) if n["id"] == "cart.count"), "")
        return act(action="tap", node="go_checkout") if "0 件" not in count else act(action="tap", node="item.oolong")
    if page == "notes":
        return act(action="tap", node="note.new")
    if page == "editor":
        body = next((n["text"] for n in screen.get("nodes", []) if n["id"] == "note.body"), "")
        return act(action="input", node="note.body", text=goal) if not body else act(action="tap", node="note.save")
    if page in ("saved", "paid"):
        return act(action="done", summary=f"{screen.get('title', '')}")
    return act(action="fail", reason=f"unknown page {page}")
