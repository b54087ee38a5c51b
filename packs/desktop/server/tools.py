"""The desktop pack: Yimi as a desktop assistant on the owner's own Mac, through its paired device.

Every tool is one operation of the same relay the ``owner-mac`` pack uses
(``POST /internal/mac/op/`` with the capability of the call being executed; docs/protocol.md,
"The Mac relay"): the platform seals it to the Mac's key, the Mac does it and answers with a
signed, sealed result. The operation's kind is the tool's name. This server never talks to
the Mac and holds no key.

Receipts say what the Mac reported. Reads have no effects. Acts: ``verified`` where the Mac
read the new state back (``activate_app``: the app is frontmost; ``write_clipboard``: the
clipboard's SHA-256 is the text's; ``set_system_state``: the settings read back as asked),
``service_ack`` otherwise (the Mac says it typed, pressed, clicked, scrolled, opened).
Refusals as owner-mac's: ``paused``, ``mac_offline`` and the Mac's own (``not_frontmost``,
``no_window``, ``wrong_app``, ``no_such_element``, ``path_outside_sandbox``, ...) are
``failed``; ``mac_timeout`` and a lost platform connection are ``unknown``.
The fake (``fake/tools.py``) runs these same handlers against a simulated Mac of its own.

Why these sixteen (the product's list has 16 desktop tools, observe and owner_data): the
frontmost app and the running apps are not tools of their own — ``list_windows`` answers both
in the same read; clicking an element and clicking a point are one act (``click``) aimed two
ways; ``open_url`` and ``open_file`` stay apart because their targets differ (a link, a file)
and a consent card must say which; volume, mute and dark mode are one settings act
(``set_system_state``) mirroring one read (``get_system_state``). Every act that touches an
application names it (``app``), so a card and the command log say where it acted, and
typing, keys and scrolling refuse (``not_frontmost``) when another app came forward.
"""

from __future__ import annotations

import hashlib
from typing import Any

from capabilities.packkit import MAC_SOURCE, ToolRegistry, effect, mac_call, mac_relay, receipt, value

TOOLS = ToolRegistry()
SOURCE = MAC_SOURCE

APP = {"type": "string", "minLength": 1, "maxLength": 64, "description": "an application's name, e.g. TextEdit"}
FRONT_APP = {**APP, "description": "the application that must be frontmost (nothing is done if another one is)"}
EMPTY: dict[str, Any] = {"type": "object", "properties": {}}
CAPTURE_SCHEMA = {
    "type": "object",
    "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 1439}, "y": {"type": "integer", "minimum": 0, "maximum": 899},
        "width": {"type": "integer", "minimum": 1, "maximum": 800}, "height": {"type": "integer", "minimum": 1, "maximum": 600},
    },
    "required": ["x", "y", "width", "height"],
}
NOTIFICATIONS_SCHEMA = {"type": "object", "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": 50}}}
FIND_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 128, "description": "part of a file name (case-insensitive)"},
        "under": {"type": "string", "minLength": 1, "maxLength": 1024, "description": "a folder to search in (default: the top folder)"},
    },
    "required": ["name"],
}
APP_SCHEMA = {"type": "object", "properties": {"app": APP}, "required": ["app"]}
TYPE_SCHEMA = {
    "type": "object",
    "properties": {"app": FRONT_APP, "text": {"type": "string", "minLength": 1, "maxLength": 4096}},
    "required": ["app", "text"],
}
KEYS_SCHEMA = {
    "type": "object",
    "properties": {"app": FRONT_APP, "keys": {"type": "string", "minLength": 1, "maxLength": 40,
                                              "description": "modifiers and one key joined by +, e.g. cmd+c, cmd+shift+t, return"}},
    "required": ["app", "keys"],
}
CLICK_SCHEMA = {
    "type": "object",
    "properties": {
        "app": {**APP, "description": "the app whose front window is clicked (with element), or that must be under the point (with x, y)"},
        "element": {"type": "string", "enum": ["close", "minimize", "zoom", "content"]},
        "x": {"type": "integer", "minimum": 0, "maximum": 1439}, "y": {"type": "integer", "minimum": 0, "maximum": 899},
    },
}
SCROLL_SCHEMA = {
    "type": "object",
    "properties": {"app": FRONT_APP, "dy": {"type": "integer", "minimum": -10000, "maximum": 10000, "description": "points down (negative: up)"},
                   "dx": {"type": "integer", "minimum": -10000, "maximum": 10000}},
    "required": ["app", "dy"],
}
CLIPBOARD_SCHEMA = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 24576}}, "required": ["text"]}
URL_SCHEMA = {"type": "object", "properties": {"url": {"type": "string", "minLength": 1, "maxLength": 2048,
                                                       "description": "an http, https or mailto link"}}, "required": ["url"]}
FILE_SCHEMA = {"type": "object", "properties": {"path": {"type": "string", "minLength": 1, "maxLength": 1024,
                                                         "description": "a path relative to the folder Yimi may use"}}, "required": ["path"]}
SYSTEM_SCHEMA = {
    "type": "object",
    "properties": {"volume": {"type": "integer", "minimum": 0, "maximum": 100}, "muted": {"type": "boolean"}, "dark_mode": {"type": "boolean"}},
}


# The Mac's own refusals in this pack's words (``paused`` and ``mac_offline``: packkit.MAC_REFUSALS).
REFUSALS = {
    "not_frontmost": "That application is not in front on the Mac; nothing was done.",
    "no_window": "That application has no open window on the Mac.",
    "wrong_app": "The point is on another application's window; nothing was clicked.",
    "no_such_element": "That window has no such element.",
    "path_outside_sandbox": "That path is outside the folder Yimi may use on the Mac.",
    "not_found": "There is no such file or folder on the Mac.",
}

# The request to the platform (packkit.mac_relay); the fake (fake/tools.py) replaces it with its simulated Mac.
relay = mac_relay


def call(kind: str, payload: dict[str, Any]) -> dict[str, Any] | tuple[dict[str, Any]]:
    """The result, or (a receipt,) that says why there is none (packkit.mac_call)."""
    return mac_call(kind, payload, REFUSALS, relay=relay)


def pick(args: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: args[name] for name in names if name in args}


def short(text: str) -> str:
    return text if len(text) <= 400 else text[:399] + "…"


# --- reads ---------------------------------------------------------------------------------------


@TOOLS("List the open windows on the owner's Mac (front to back), the frontmost app and the running apps.", EMPTY)
def list_windows(args: dict[str, Any]) -> dict[str, Any]:
    result = call("list_windows", {})
    if isinstance(result, tuple):
        return result[0]
    windows = result["windows"]
    return receipt(
        "succeeded", summary=f"{len(windows)} windows are open on the Mac; {result['frontmost_app']} is in front.",
        values=[value("windows", len(windows), "window", SOURCE), value("frontmost_app", result["frontmost_app"], None, SOURCE),
                value("running_apps", len(result["running_apps"]), "app", SOURCE)],
        content={"items": windows, "text": "\n".join(f"{w['app']}: {w['title']}" + (" (minimized)" if w["minimized"] else "") for w in windows)},
    )


@TOOLS("Read the text on the owner's Mac clipboard.", EMPTY)
def read_clipboard(args: dict[str, Any]) -> dict[str, Any]:
    result = call("read_clipboard", {})
    if isinstance(result, tuple):
        return result[0]
    return receipt(
        "succeeded", summary="Read the Mac's clipboard." if result["size"] else "The Mac's clipboard is empty.",
        values=[value("size", result["size"], "byte", SOURCE)],
        content={"text": result["text"], "items": [{"size": result["size"], "sha256": result["sha256"]}]},
    )


@TOOLS("Read the text selected in the frontmost window on the owner's Mac.", EMPTY)
def read_selection(args: dict[str, Any]) -> dict[str, Any]:
    result = call("read_selection", {})
    if isinstance(result, tuple):
        return result[0]
    return receipt(
        "succeeded", summary=f"Read the selection in {result['app']} on the Mac." if result["size"] else f"Nothing is selected in {result['app']}.",
        values=[value("size", result["size"], "byte", SOURCE), value("app", result["app"], None, SOURCE)],
        content={"text": result["text"], "items": [{"app": result["app"], "window": result["window"], "size": result["size"], "sha256": result["sha256"]}]},
    )


@TOOLS("Capture a region of the owner's Mac screen (points from the top left; a PNG, returned as base64).", CAPTURE_SCHEMA)
def capture_region(args: dict[str, Any]) -> dict[str, Any]:
    result = call("capture_region", pick(args, "x", "y", "width", "height"))
    if isinstance(result, tuple):
        return result[0]
    return receipt(
        "succeeded", summary=f"Captured {result['width']}x{result['height']} of the Mac's screen.",
        values=[value("width", result["width"], "pixel", SOURCE), value("height", result["height"], "pixel", SOURCE),
                value("size", result["size"], "byte", SOURCE)],
        content={"items": [{"format": result["format"], "region": result["region"], "width": result["width"], "height": result["height"],
                            "sha256": result["sha256"], "image_b64": result["image_b64"], "simulated": bool(result.get("simulated", False))}]},
    )


@TOOLS("Read the latest notifications on the owner's Mac (newest first).", NOTIFICATIONS_SCHEMA)
def read_notifications(args: dict[str, Any]) -> dict[str, Any]:
    result = call("read_notifications", pick(args, "limit"))
    if isinstance(result, tuple):
        return result[0]
    notes = result["notifications"]
    return receipt(
        "succeeded", summary=f"{result['total']} notifications on the Mac.",
        values=[value("notifications", result["total"], "notification", SOURCE)],
        content={"items": notes, "text": "\n".join(short(f"{n['app']}: {n['title']} — {n['body']}") for n in notes)},
    )


@TOOLS("Find files and folders by name on the owner's Mac, in the folder Yimi may use (at most 200 matches).", FIND_SCHEMA)
def find_files(args: dict[str, Any]) -> dict[str, Any]:
    result = call("find_files", pick(args, "name", "under"))
    if isinstance(result, tuple):
        return result[0]
    return receipt(
        "succeeded", summary=f"{result['total']} matches for {result['name']!r} on the Mac.",
        values=[value("matches", result["total"], "file", SOURCE), value("truncated", bool(result["truncated"]), None, SOURCE)],
        content={"items": result["matches"], "text": "\n".join(m["path"] for m in result["matches"])},
    )


@TOOLS("Read the owner's Mac volume, mute, dark mode and battery.", EMPTY)
def get_system_state(args: dict[str, Any]) -> dict[str, Any]:
    result = call("get_system_state", {})
    if isinstance(result, tuple):
        return result[0]
    return receipt(
        "succeeded", summary=f"Volume {result['volume']}%, dark mode {'on' if result['dark_mode'] else 'off'}, battery {result['battery_percent']}%.",
        values=[value("volume", result["volume"], "percent", SOURCE), value("muted", bool(result["muted"]), None, SOURCE),
                value("dark_mode", bool(result["dark_mode"]), None, SOURCE), value("battery", result["battery_percent"], "percent", SOURCE),
                value("charging", bool(result["charging"]), None, SOURCE)],
        content={"items": [result]},
    )


# --- acts ----------------------------------------------------------------------------------------


@TOOLS("Bring an application to the front on the owner's Mac, launching it if it is not running.", APP_SCHEMA)
def activate_app(args: dict[str, Any]) -> dict[str, Any]:
    result = call("activate_app", pick(args, "app"))
    if isinstance(result, tuple):
        return result[0]
    front = result["frontmost"] == result["app"]
    return receipt(
        "succeeded", summary=f"{result['app']} is in front on the Mac." if front else f"Asked {result['app']} to come forward.",
        effects=[effect(f"app:{result['app']}", "activate", "verified" if front else "not_verified")],
        values=[value("was_running", bool(result["was_running"]), None, SOURCE)],
        content={"items": [{"app": result["app"], "was_running": result["was_running"], "frontmost": result["frontmost"], "window": result["window"]}]},
    )


@TOOLS("Type text into an application's front window on the owner's Mac (the app must be frontmost).", TYPE_SCHEMA)
def type_text(args: dict[str, Any]) -> dict[str, Any]:
    result = call("type_text", pick(args, "app", "text"))
    if isinstance(result, tuple):
        return result[0]
    return receipt(
        "succeeded", summary=f"Typed {result['characters']} characters into {result['app']} on the Mac.",
        effects=[effect(f"app:{result['app']}", "type", "service_ack")],
        values=[value("characters", result["characters"], "character", SOURCE)],
        content={"items": [{"app": result["app"], "window": result["window"], "size": result["size"], "sha256": result["sha256"]}]},
    )


@TOOLS("Press a key combination (cmd+c, cmd+v, return, ...) in an application on the owner's Mac (the app must be frontmost).", KEYS_SCHEMA)
def press_keys(args: dict[str, Any]) -> dict[str, Any]:
    result = call("press_keys", pick(args, "app", "keys"))
    if isinstance(result, tuple):
        return result[0]
    return receipt(
        "succeeded", summary=f"Pressed {result['keys']} in {result['app']} on the Mac.",
        effects=[effect(f"app:{result['app']}", f"press {result['keys']}", "service_ack")],
        content={"items": [{"app": result["app"], "keys": result["keys"], "effect": result["effect"], "frontmost": result["frontmost"]}]},
    )


@TOOLS("Click on the owner's Mac: an element (close, minimize, zoom, content) of an app's front window, or a point (x, y).", CLICK_SCHEMA)
def click(args: dict[str, Any]) -> dict[str, Any]:
    if ("element" in args) == ("x" in args or "y" in args) or ("element" in args and "app" not in args):
        return receipt("failed", summary="click needs an app and an element, or x and y", retry="forbidden",
                       error=("invalid_request", "give app and element, or x and y (optionally with app)"))
    result = call("click", pick(args, "app", "element", "x", "y"))
    if isinstance(result, tuple):
        return result[0]
    where = result["element"] if "x" not in result else f"({result['x']}, {result['y']}) on {result['element']}"
    return receipt(
        "succeeded", summary=f"Clicked {where} of {result['app']} on the Mac.",
        effects=[effect(f"app:{result['app']}", f"click {result['element']}", "service_ack")],
        content={"items": [{k: result[k] for k in ("app", "element", "window", "frontmost", "x", "y") if k in result}]},
    )


@TOOLS("Scroll an application's front window on the owner's Mac (the app must be frontmost).", SCROLL_SCHEMA)
def scroll(args: dict[str, Any]) -> dict[str, Any]:
    result = call("scroll", pick(args, "app", "dx", "dy"))
    if isinstance(result, tuple):
        return result[0]
    return receipt(
        "succeeded", summary=f"Scrolled {result['app']} on the Mac.",
        effects=[effect(f"app:{result['app']}", "scroll", "service_ack")],
        values=[value("scroll_y", result["scroll_y"], "point", SOURCE), value("scroll_x", result["scroll_x"], "point", SOURCE)],
        content={"items": [{"app": result["app"], "window": result["window"]}]},
    )


@TOOLS("Put text on the owner's Mac clipboard (replacing what is there).", CLIPBOARD_SCHEMA)
def write_clipboard(args: dict[str, Any]) -> dict[str, Any]:
    text = args.get("text")
    if not isinstance(text, str):
        return receipt("failed", summary="text must be text", retry="forbidden", error=("invalid_request", "text must be a string"))
    result = call("write_clipboard", {"text": text})
    if isinstance(result, tuple):
        return result[0]
    verified = result["sha256"] == hashlib.sha256(text.encode("utf-8")).hexdigest()
    return receipt(
        "succeeded", summary="Put the text on the Mac's clipboard.",
        effects=[effect("mac:clipboard", "write", "verified" if verified else "not_verified")],
        values=[value("size", result["size"], "byte", SOURCE)],
        content={"items": [{"size": result["size"], "sha256": result["sha256"]}]},
    )


@TOOLS("Open a web (http, https) or mail (mailto) link on the owner's Mac with its default app.", URL_SCHEMA)
def open_url(args: dict[str, Any]) -> dict[str, Any]:
    result = call("open_url", pick(args, "url"))
    if isinstance(result, tuple):
        return result[0]
    return receipt(
        "succeeded", summary=f"Opened the link in {result['app']} on the Mac.",
        effects=[effect(f"url:{result['url']}"[:500], "open", "service_ack")],
        content={"items": [{"url": result["url"], "app": result["app"], "window": result["window"], "frontmost": result["frontmost"]}]},
    )


@TOOLS("Open a file or folder on the owner's Mac with its default app.", FILE_SCHEMA)
def open_file(args: dict[str, Any]) -> dict[str, Any]:
    result = call("open_file", pick(args, "path"))
    if isinstance(result, tuple):
        return result[0]
    return receipt(
        "succeeded", summary=f"Opened {result['path']} in {result['app']} on the Mac.",
        effects=[effect(f"mac:{result['path']}"[:500], "open", "service_ack")],
        content={"items": [{k: result[k] for k in ("path", "app", "window", "size", "sha256", "frontmost")}]},
    )


@TOOLS("Change the owner's Mac volume (0-100), mute or dark mode; give at least one.", SYSTEM_SCHEMA)
def set_system_state(args: dict[str, Any]) -> dict[str, Any]:
    asked = pick(args, "volume", "muted", "dark_mode")
    result = call("set_system_state", asked)
    if isinstance(result, tuple):
        return result[0]
    verified = all(result["after"].get(k) == v for k, v in asked.items())
    return receipt(
        "succeeded", summary="Changed " + ", ".join(f"{k} to {result['after'][k]}" for k in result["changed"]) + " on the Mac.",
        effects=[effect(f"mac:system:{k}", "set", "verified" if verified else "not_verified") for k in result["changed"]],
        values=[value(k, result["after"][k], "percent" if k == "volume" else None, SOURCE) for k in result["changed"]],
        content={"items": [{"changed": result["changed"], "before": result["before"], "after": result["after"]}]},
    )
