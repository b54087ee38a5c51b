"""What the simulated Mac's desktop does with a ``desktop`` pack operation (docs/protocol.md,
"The Mac relay", desktop op kinds). Standard library only; mixed into
``devices.mac.sandbox.MacSandbox``, so ``device_sim mac`` and the packs' fakes run it.

The desktop is SIMULATED: there is no window server here. Its state is one JSON file in the
sandbox (``DESKTOP_STATE``) holding windows (front to back; each with an app, a title,
bounds, the text in it, a selection and a scroll position), the clipboard, the notification
centre, volume, mute, dark mode and a fixed battery. Running applications are the same
``.yimi-apps.json`` the ``owner-mac`` pack's ``operate_app`` keeps (Finder always runs), so
quitting an app there closes its windows here. A fresh sandbox starts with one Finder window
and one notification saying the desktop is simulated. What each act does to that state is
written at its ``op_`` method; a real Mac client does the same through the Accessibility
and AppKit APIs, and answers with the same fields.

Sizes stay under the websocket's 64 KiB frame once sealed: texts are at most ``MAX_TEXT_BYTES``,
a captured region at most ``MAX_CAPTURE`` pixels a side (flat-coloured rectangles, which
compress to a few KiB).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import struct
import zlib
from pathlib import Path
from typing import Any

DESKTOP_STATE = ".yimi-desktop.json"
APPS_STATE = ".yimi-apps.json"  # shared with MacSandbox.op_operate_app
STATE_FILES = (DESKTOP_STATE, APPS_STATE)
ALWAYS_RUNNING = "Finder"
SCREEN = (1440, 900)
MENU_BAR = 25
TITLE_BAR = 22
MAX_TEXT_BYTES = 24 * 1024
MAX_TYPED_CHARS = 4096
MAX_CAPTURE = (800, 600)
MAX_WINDOWS = 50
MAX_NOTIFICATIONS = 50
MAX_MATCHES = 200
MAX_SCANNED = 5000
URL_APPS = {"http": "Safari", "https": "Safari", "mailto": "Mail"}
FILE_APPS = {".txt": "TextEdit", ".md": "TextEdit", ".rtf": "TextEdit", ".pdf": "Preview", ".png": "Preview", ".jpg": "Preview",
             ".jpeg": "Preview", ".html": "Safari", ".csv": "Numbers", ".key": "Keynote"}
MODIFIERS = ("cmd", "ctrl", "alt", "shift")
MODIFIER_ALIASES = {"command": "cmd", "⌘": "cmd", "control": "ctrl", "option": "alt", "opt": "alt"}
NAMED_KEYS = frozenset({"return", "enter", "escape", "esc", "tab", "space", "delete", "backspace", "up", "down", "left", "right",
                        "home", "end", "pageup", "pagedown", *(f"f{i}" for i in range(1, 13))})
ELEMENTS = ("close", "minimize", "zoom", "content")

# The desktop pack's operations (each is also the tool's name: the relay lets a call do only
# its own tool's operation). Reads need an observe decision, acts an owner_data one.
DESKTOP_READ_KINDS = ("list_windows", "read_clipboard", "read_selection", "capture_region", "read_notifications", "find_files",
                      "get_system_state")
DESKTOP_WRITE_KINDS = ("activate_app", "type_text", "press_keys", "click", "scroll", "write_clipboard", "open_url", "open_file",
                       "set_system_state")
DESKTOP_KINDS = DESKTOP_READ_KINDS + DESKTOP_WRITE_KINDS


class DesktopRefused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def digest(text: str) -> tuple[int, str]:
    data = text.encode("utf-8")
    return len(data), hashlib.sha256(data).hexdigest()


def default_state() -> dict[str, Any]:
    return {
        "windows": [{"id": 1, "app": ALWAYS_RUNNING, "title": "Desktop", "bounds": [40, 60, 800, 500], "text": "", "selection": [0, 0],
                     "scroll": [0, 0], "minimized": False}],
        "next_window": 2, "clipboard": "",
        "notifications": [{"app": "Yimi", "title": "Simulated desktop", "body": "This Mac's desktop is simulated by device_sim mac."}],
        "volume": 50, "muted": False, "dark_mode": False, "battery_percent": 87, "charging": False,
    }


def _text_arg(payload: dict[str, Any], name: str, *, max_chars: int, allow_empty: bool = False) -> str:
    text = payload.get(name)
    if not isinstance(text, str) or (not text and not allow_empty) or len(text) > max_chars or len(text.encode("utf-8")) > MAX_TEXT_BYTES:
        raise DesktopRefused("invalid_request", f"{name} is text of {0 if allow_empty else 1}-{max_chars} characters (at most {MAX_TEXT_BYTES} bytes)")
    return text


def _int_arg(payload: dict[str, Any], name: str, low: int, high: int, default: int | None = None) -> int:
    value = payload.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise DesktopRefused("invalid_request", f"{name} is a whole number from {low} to {high}")
    return value


def _app_arg(payload: dict[str, Any]) -> str:
    app = payload.get("app")
    if not isinstance(app, str) or not 1 <= len(app) <= 64 or any(ord(c) < 32 for c in app):
        raise DesktopRefused("invalid_request", "app is an application name of 1-64 characters")
    return app


def parse_keys(keys: Any) -> tuple[list[str], str]:
    """``"cmd+shift+a"`` → (["cmd", "shift"], "a"); modifiers in a fixed order, one key."""
    if not isinstance(keys, str) or not 1 <= len(keys) <= 40:
        raise DesktopRefused("invalid_request", "keys is a combination such as cmd+c (at most 40 characters)")
    parts = [p.strip().lower() for p in keys.split("+")]
    *mods, key = [MODIFIER_ALIASES.get(p, p) for p in parts]
    if any(m not in MODIFIERS for m in mods) or len(set(mods)) != len(mods):
        raise DesktopRefused("invalid_request", f"modifiers are {', '.join(MODIFIERS)}, each at most once")
    if not (re.fullmatch(r"[a-z0-9]", key) or key in NAMED_KEYS or (len(key) == 1 and key in "`-=[]\\;',./")):
        raise DesktopRefused("invalid_request", "the key is a letter, a digit, a punctuation key or a named key (return, escape, tab, f1...)")
    return [m for m in MODIFIERS if m in mods], key


class DesktopOps:
    """The desktop operations of the simulated Mac (``op_<kind>``); ``root`` is the sandbox."""

    root: Path

    # --- state ------------------------------------------------------------------------------

    def _running(self) -> set[str]:
        path = self.root / APPS_STATE
        return (set(json.loads(path.read_text())) if path.exists() else set()) | {ALWAYS_RUNNING}

    def _save_running(self, running: set[str]) -> None:
        (self.root / APPS_STATE).write_text(json.dumps(sorted(running - {ALWAYS_RUNNING})))

    def _load(self) -> dict[str, Any]:
        path = self.root / DESKTOP_STATE
        state = json.loads(path.read_text()) if path.exists() else default_state()
        running = self._running()
        state["windows"] = [w for w in state["windows"] if w["app"] in running]  # an app quit elsewhere took its windows
        return state

    def _save(self, state: dict[str, Any]) -> None:
        path = self.root / DESKTOP_STATE
        tmp = path.with_name(f".{path.name}.yimi-tmp")
        tmp.write_text(json.dumps(state, ensure_ascii=False))
        os.replace(tmp, path)

    @staticmethod
    def _frontmost(state: dict[str, Any]) -> str:
        visible = [w for w in state["windows"] if not w["minimized"]]
        return visible[0]["app"] if visible else ALWAYS_RUNNING

    @staticmethod
    def _front_window(state: dict[str, Any], app: str | None = None) -> dict[str, Any] | None:
        for window in state["windows"]:
            if not window["minimized"] and (app is None or window["app"] == app):
                return window
        return None

    @staticmethod
    def _raise(state: dict[str, Any], window: dict[str, Any]) -> None:
        window["minimized"] = False
        state["windows"].remove(window)
        state["windows"].insert(0, window)

    def _new_window(self, state: dict[str, Any], app: str, title: str, text: str = "") -> dict[str, Any]:
        if len(state["windows"]) >= MAX_WINDOWS:
            raise DesktopRefused("too_many_windows", f"the simulated desktop holds at most {MAX_WINDOWS} windows")
        n = state["next_window"]
        offset = 30 * (n % 10)
        window = {"id": n, "app": app, "title": title[:200], "bounds": [120 + offset, 80 + offset, 900, 600], "text": text,
                  "selection": [len(text), len(text)], "scroll": [0, 0], "minimized": False}
        state["next_window"] = n + 1
        state["windows"].insert(0, window)
        running = self._running()
        if app not in running:
            self._save_running(running | {app})
        return window

    def _require_front(self, state: dict[str, Any], app: str) -> dict[str, Any]:
        front = self._frontmost(state)
        if front != app:
            raise DesktopRefused("not_frontmost", f"{app} is not the frontmost application ({front} is); activate it first")
        window = self._front_window(state, app)
        if window is None:
            raise DesktopRefused("no_window", f"{app} has no open window")
        return window

    @staticmethod
    def _window_view(window: dict[str, Any], front_id: int | None) -> dict[str, Any]:
        return {"id": window["id"], "app": window["app"], "title": window["title"], "bounds": window["bounds"],
                "minimized": window["minimized"], "frontmost": window["id"] == front_id}

    # --- reads ------------------------------------------------------------------------------

    def op_list_windows(self, payload: dict[str, Any]) -> dict[str, Any]:
        state = self._load()
        front = self._front_window(state)
        return {"windows": [self._window_view(w, front["id"] if front else None) for w in state["windows"]],
                "frontmost_app": self._frontmost(state), "running_apps": sorted(self._running())}

    def op_read_clipboard(self, payload: dict[str, Any]) -> dict[str, Any]:
        text = self._load()["clipboard"]
        size, sha = digest(text)
        return {"text": text, "size": size, "sha256": sha}

    def op_read_selection(self, payload: dict[str, Any]) -> dict[str, Any]:
        state = self._load()
        window = self._front_window(state)
        text = window["text"][window["selection"][0]:window["selection"][1]] if window else ""
        size, sha = digest(text)
        return {"app": self._frontmost(state), "window": window["title"] if window else "", "text": text, "size": size, "sha256": sha}

    def op_capture_region(self, payload: dict[str, Any]) -> dict[str, Any]:
        x, y = _int_arg(payload, "x", 0, SCREEN[0] - 1), _int_arg(payload, "y", 0, SCREEN[1] - 1)
        width = _int_arg(payload, "width", 1, MAX_CAPTURE[0])
        height = _int_arg(payload, "height", 1, MAX_CAPTURE[1])
        width, height = min(width, SCREEN[0] - x), min(height, SCREEN[1] - y)  # clipped to the screen
        png = render_region(self._load(), x, y, width, height)
        return {"region": [x, y, width, height], "width": width, "height": height, "format": "png", "size": len(png),
                "sha256": hashlib.sha256(png).hexdigest(), "image_b64": base64.b64encode(png).decode(), "simulated": True}

    def op_read_notifications(self, payload: dict[str, Any]) -> dict[str, Any]:
        limit = _int_arg(payload, "limit", 1, MAX_NOTIFICATIONS, default=20)
        notes = self._load()["notifications"]
        return {"notifications": list(reversed(notes))[:limit], "total": len(notes)}

    def op_find_files(self, payload: dict[str, Any]) -> dict[str, Any]:
        name = payload.get("name")
        if not isinstance(name, str) or not 1 <= len(name) <= 128 or "/" in name or "\x00" in name:
            raise DesktopRefused("invalid_request", "name is 1-128 characters of a file name (no /)")
        under = self.resolve(payload.get("under", "."), allow_root=True)  # type: ignore[attr-defined]
        if not under.is_dir():
            raise DesktopRefused("not_found", "no such directory")
        needle, scanned, total = name.casefold(), 0, 0
        matches: list[dict[str, Any]] = []
        for folder, dirs, files in os.walk(under):  # symlinks are not followed
            dirs.sort()
            for entry in sorted(dirs) + sorted(files):
                scanned += 1
                if entry in STATE_FILES or entry.endswith(".yimi-tmp") or needle not in entry.casefold():
                    continue
                total += 1
                path = Path(folder) / entry
                if len(matches) < MAX_MATCHES:
                    link = path.is_symlink()
                    is_file = path.is_file() and not link
                    kind = "other" if link else "dir" if entry in dirs else "file" if is_file else "other"
                    matches.append({"path": self.relative(path), "kind": kind, "size": path.stat().st_size if is_file else None})  # type: ignore[attr-defined]
            if scanned >= MAX_SCANNED:
                break
        return {"name": name, "under": self.relative(under), "matches": matches, "total": total,  # type: ignore[attr-defined]
                "truncated": total > len(matches) or scanned >= MAX_SCANNED}

    def op_get_system_state(self, payload: dict[str, Any]) -> dict[str, Any]:
        state = self._load()
        return {key: state[key] for key in ("volume", "muted", "dark_mode", "battery_percent", "charging")} | {
            "screen_width": SCREEN[0], "screen_height": SCREEN[1], "simulated": True}

    # --- acts -------------------------------------------------------------------------------

    def op_activate_app(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Launch the app if it is not running, bring its front window forward (an app
        without a window gets an empty one, as most document apps do)."""
        app = _app_arg(payload)
        state = self._load()
        was_running = app in self._running()
        window = next((w for w in state["windows"] if w["app"] == app), None)
        if window is None:
            window = self._new_window(state, app, "Untitled")
        else:
            self._raise(state, window)
        self._save(state)
        return {"app": app, "was_running": was_running, "frontmost": self._frontmost(state), "window": window["title"]}

    def op_type_text(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Type into the front window of ``app`` (which must be frontmost): the text replaces
        the selection and the caret follows it."""
        app = _app_arg(payload)
        text = _text_arg(payload, "text", max_chars=MAX_TYPED_CHARS)
        state = self._load()
        window = self._require_front(state, app)
        start, end = window["selection"]
        new = window["text"][:start] + text + window["text"][end:]
        if len(new.encode("utf-8")) > MAX_TEXT_BYTES:
            raise DesktopRefused("too_large", f"a simulated window holds at most {MAX_TEXT_BYTES} bytes of text")
        window["text"], window["selection"] = new, [start + len(text), start + len(text)]
        self._save(state)
        size, sha = digest(text)
        return {"app": app, "window": window["title"], "size": size, "sha256": sha, "characters": len(text)}

    def op_press_keys(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A key combination in ``app`` (frontmost). Simulated effects: cmd+a select all,
        cmd+c copy, cmd+x cut, cmd+v paste, cmd+n new window, cmd+w close window, cmd+q quit;
        any other valid combination reaches the window and changes nothing here
        (``effect: none``)."""
        app = _app_arg(payload)
        mods, key = parse_keys(payload.get("keys"))
        combo = "+".join([*mods, key])
        state = self._load()
        window = self._require_front(state, app)
        start, end = window["selection"]
        effect = "none"
        if mods == ["cmd"]:
            if key == "a":
                window["selection"], effect = [0, len(window["text"])], "selected_all"
            elif key in ("c", "x") and end > start:
                state["clipboard"] = window["text"][start:end]
                effect = "copied"
                if key == "x":
                    window["text"], window["selection"], effect = window["text"][:start] + window["text"][end:], [start, start], "cut"
            elif key == "v":
                new = window["text"][:start] + state["clipboard"] + window["text"][end:]
                if len(new.encode("utf-8")) > MAX_TEXT_BYTES:
                    raise DesktopRefused("too_large", f"a simulated window holds at most {MAX_TEXT_BYTES} bytes of text")
                caret = start + len(state["clipboard"])
                window["text"], window["selection"], effect = new, [caret, caret], "pasted"
            elif key == "n":
                self._new_window(state, app, "Untitled")
                effect = "new_window"
            elif key == "w":
                state["windows"].remove(window)
                effect = "closed_window"
            elif key == "q" and app != ALWAYS_RUNNING:
                state["windows"] = [w for w in state["windows"] if w["app"] != app]
                self._save_running(self._running() - {app})
                effect = "quit"
        self._save(state)
        return {"app": app, "keys": combo, "effect": effect, "frontmost": self._frontmost(state)}

    def op_click(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A click on a named element of an app's front window (``close``, ``minimize``,
        ``zoom``, ``content``) or at screen coordinates (the topmost window there comes to
        the front; with ``app`` given, the point must be on that app's window)."""
        state = self._load()
        if "element" in payload:
            app = _app_arg(payload)
            element = payload.get("element")
            if element not in ELEMENTS:
                raise DesktopRefused("no_such_element", f"the simulated windows have the elements {', '.join(ELEMENTS)}")
            window = next((w for w in state["windows"] if w["app"] == app), None)
            if window is None:
                raise DesktopRefused("no_window", f"{app} has no open window")
            if element == "close":
                state["windows"].remove(window)
            elif element == "minimize":
                window["minimized"] = True
            else:
                if element == "zoom":
                    window["bounds"] = [0, MENU_BAR, SCREEN[0], SCREEN[1] - MENU_BAR]
                self._raise(state, window)
            self._save(state)
            return {"app": app, "element": element, "window": window["title"], "frontmost": self._frontmost(state)}
        x, y = _int_arg(payload, "x", 0, SCREEN[0] - 1), _int_arg(payload, "y", 0, SCREEN[1] - 1)
        hit = next((w for w in state["windows"] if not w["minimized"] and _inside(w["bounds"], x, y)), None)
        wanted = payload.get("app")
        hit_app = hit["app"] if hit else ALWAYS_RUNNING  # the desktop itself is Finder's
        if wanted is not None and wanted != hit_app:
            raise DesktopRefused("wrong_app", f"the point ({x}, {y}) is on {hit_app}, not {wanted}; nothing was clicked")
        element = "desktop"
        if hit is not None:
            element = "title_bar" if y < hit["bounds"][1] + TITLE_BAR else "content"
            self._raise(state, hit)
            self._save(state)
        return {"app": hit_app, "element": element, "x": x, "y": y, "window": hit["title"] if hit else "", "frontmost": self._frontmost(state)}

    def op_scroll(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Scroll the front window of ``app`` (frontmost) by ``dx``/``dy`` points; a scroll
        position never goes below zero."""
        app = _app_arg(payload)
        dx, dy = _int_arg(payload, "dx", -10000, 10000, default=0), _int_arg(payload, "dy", -10000, 10000)
        state = self._load()
        window = self._require_front(state, app)
        window["scroll"] = [max(0, window["scroll"][0] + dx), max(0, window["scroll"][1] + dy)]
        self._save(state)
        return {"app": app, "window": window["title"], "scroll_x": window["scroll"][0], "scroll_y": window["scroll"][1]}

    def op_write_clipboard(self, payload: dict[str, Any]) -> dict[str, Any]:
        text = _text_arg(payload, "text", max_chars=MAX_TEXT_BYTES, allow_empty=True)
        state = self._load()
        state["clipboard"] = text
        self._save(state)
        size, sha = digest(self._load()["clipboard"])  # read back
        return {"size": size, "sha256": sha}

    def op_open_url(self, payload: dict[str, Any]) -> dict[str, Any]:
        url = payload.get("url")
        scheme = url.partition(":")[0].lower() if isinstance(url, str) else ""
        if not isinstance(url, str) or len(url) > 2048 or scheme not in URL_APPS or re.search(r"[\s\x00-\x1f]", url):
            raise DesktopRefused("invalid_request", f"url is an {', '.join(sorted(URL_APPS))} URL of at most 2048 characters")
        state = self._load()
        app = URL_APPS[scheme]
        window = self._new_window(state, app, url)
        self._save(state)
        return {"url": url, "app": app, "window": window["title"], "frontmost": self._frontmost(state)}

    def op_open_file(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Open a sandbox file (or folder) with its default app: a new front window; a text
        file's content is in it (so cmd+a then read_selection reads it back)."""
        target = self.resolve(payload.get("path"), allow_root=True)  # type: ignore[attr-defined]
        if target.name in STATE_FILES or not target.exists():
            raise DesktopRefused("not_found", "no such file or folder")
        state = self._load()
        if target.is_dir():
            app, text, size, sha = ALWAYS_RUNNING, "", None, ""
        else:
            data = target.read_bytes()
            app, size, sha = FILE_APPS.get(target.suffix.lower(), "TextEdit"), len(data), hashlib.sha256(data).hexdigest()
            try:
                text = data.decode("utf-8") if app == "TextEdit" and len(data) <= MAX_TEXT_BYTES else ""
            except UnicodeDecodeError:
                text = ""
        window = self._new_window(state, app, target.name or ".", text)
        window["selection"] = [0, 0]
        self._save(state)
        return {"path": self.relative(target), "app": app, "window": window["title"], "size": size, "sha256": sha,  # type: ignore[attr-defined]
                "frontmost": self._frontmost(state)}

    def op_set_system_state(self, payload: dict[str, Any]) -> dict[str, Any]:
        changes: dict[str, Any] = {}
        if "volume" in payload:
            changes["volume"] = _int_arg(payload, "volume", 0, 100)
        for flag in ("muted", "dark_mode"):
            if flag in payload:
                if not isinstance(payload[flag], bool):
                    raise DesktopRefused("invalid_request", f"{flag} is true or false")
                changes[flag] = payload[flag]
        if not changes:
            raise DesktopRefused("invalid_request", "give at least one of volume, muted, dark_mode")
        state = self._load()
        before = {key: state[key] for key in changes}
        state.update(changes)
        self._save(state)
        after = self._load()  # read back
        return {"changed": sorted(changes), "before": before, "after": {key: after[key] for key in changes}}


def _inside(bounds: list[int], x: int, y: int) -> bool:
    bx, by, bw, bh = bounds
    return bx <= x < bx + bw and by <= y < by + bh


def app_colour(app: str) -> bytes:
    return hashlib.sha256(app.encode()).digest()[:3]


def render_region(state: dict[str, Any], x: int, y: int, width: int, height: int) -> bytes:
    """A PNG of the simulated screen's region: the wallpaper, the menu bar and each visible
    window as a flat rectangle in its app's colour (darker title bar), back to front."""
    dark = state["dark_mode"]
    wallpaper, bar = (b"\x1e\x1e\x28", b"\x2c\x2c\x2e") if dark else (b"\xdc\xdc\xe1", b"\xf5\xf5\xf7")
    windows = [w for w in reversed(state["windows"]) if not w["minimized"]]
    rows = []
    for row_y in range(y, y + height):
        row = bytearray((bar if row_y < MENU_BAR else wallpaper) * width)
        for window in windows:
            wx, wy, ww, wh = window["bounds"]
            if not wy <= row_y < wy + wh:
                continue
            x0, x1 = max(wx, x), min(wx + ww, x + width)
            if x0 >= x1:
                continue
            colour = app_colour(window["app"])
            if row_y < wy + TITLE_BAR:
                colour = bytes(c // 2 for c in colour)
            row[(x0 - x) * 3:(x1 - x) * 3] = colour * (x1 - x0)
        rows.append(b"\x00" + bytes(row))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"".join(rows), 9)) + chunk(b"IEND", b"")
