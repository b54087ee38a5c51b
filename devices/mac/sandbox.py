"""What the simulated Mac does with an operation: everything inside one sandbox directory.

Used by ``device_sim mac`` (the simulated Mac) and by the ``owner-mac`` pack's fake. Standard
library only. Each operation takes the decrypted payload and returns the result payload
(``{"status": "ok", ...}`` or ``{"status": "error", "code", "message"}``); nothing raises.

Rules of the sandbox:

- paths are relative to the sandbox; an absolute path, ``..`` that leaves it, or a symlink
  that points out of it is refused with ``path_outside_sandbox`` (checked on the resolved
  path, so a link inside the sandbox cannot be used to escape);
- ``run_command`` runs an argv (no shell) from a short list of programs (``ALLOWED_PROGRAMS``)
  with the sandbox as working directory and an empty environment, each argument that names a
  path checked like the paths above, at most ``COMMAND_SECONDS`` seconds; a real Mac client
  runs what the owner allowed it to, the simulator stays in its directory;
- ``operate_app`` and ``screenshot`` are simulated: applications are names in a state file
  (``.yimi-apps.json``) in the sandbox, a screenshot is a small PNG made here;
- the ``desktop`` pack's operations (windows, clipboard, keys, clicks, system settings) act
  on a simulated desktop kept in ``.yimi-desktop.json`` (devices/mac/desktop.py).

Sizes are kept under the websocket's 64 KiB frame once sealed: a read returns at most
``MAX_READ_BYTES`` (and says ``truncated``), command output keeps its last ``MAX_OUTPUT_BYTES``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

from devices.mac.desktop import DESKTOP_KINDS, DESKTOP_STATE, DesktopOps, DesktopRefused

MAX_READ_BYTES = 24 * 1024
MAX_WRITE_BYTES = 24 * 1024
MAX_OUTPUT_BYTES = 8 * 1024
MAX_ENTRIES = 200
COMMAND_SECONDS = 20
ALLOWED_PROGRAMS = frozenset({"echo", "ls", "cat", "wc", "pwd", "true", "false", "sha256sum", "head", "tail", "date"})
APP_STATE = ".yimi-apps.json"
APP_ACTIONS = ("open", "activate", "quit")
FILE_KINDS = ("read_file", "write_file", "list_dir", "run_command", "operate_app", "screenshot")  # the owner-mac pack's
KINDS = FILE_KINDS + DESKTOP_KINDS  # and the desktop pack's (devices/mac/desktop.py)


class Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class MacSandbox(DesktopOps):
    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    # --- paths ------------------------------------------------------------------------------

    def resolve(self, path: Any, *, allow_root: bool = False) -> Path:
        if not isinstance(path, str) or len(path) > 1024 or "\x00" in path:
            raise Refused("invalid_request", "path must be a string of at most 1024 characters")
        if path.startswith(("/", "~")):
            raise Refused("path_outside_sandbox", "paths are relative to the sandbox")
        target = (self.root / path).resolve()
        if target != self.root and self.root not in target.parents:
            raise Refused("path_outside_sandbox", "the path leaves the sandbox")
        if target == self.root and not allow_root:
            raise Refused("invalid_request", "name a file inside the sandbox")
        return target

    def relative(self, path: Path) -> str:
        return str(path.relative_to(self.root)) if path != self.root else "."

    # --- operations -------------------------------------------------------------------------

    def execute(self, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        handler = getattr(self, f"op_{kind}", None) if kind in KINDS else None
        try:
            if handler is None:
                raise Refused("unknown_op", f"unknown operation {kind[:32]!r}")
            return {"status": "ok", **handler(payload)}
        except (Refused, DesktopRefused) as exc:
            return {"status": "error", "code": exc.code, "message": exc.message}
        except OSError as exc:
            return {"status": "error", "code": "os_error", "message": f"{type(exc).__name__}: {exc.strerror or exc}"}

    def op_read_file(self, payload: dict[str, Any]) -> dict[str, Any]:
        target = self.resolve(payload.get("path"))
        if not target.is_file():
            raise Refused("not_found", "no such file")
        data = target.read_bytes()
        shown = data[:MAX_READ_BYTES]
        return {"path": self.relative(target), "size": len(data), "sha256": sha256(data), "truncated": len(data) > len(shown),
                "content_b64": base64.b64encode(shown).decode()}

    def op_write_file(self, payload: dict[str, Any]) -> dict[str, Any]:
        target = self.resolve(payload.get("path"))
        content = payload.get("content_b64")
        try:
            data = base64.b64decode(content, validate=True) if isinstance(content, str) else None
        except ValueError:
            data = None
        if data is None:
            raise Refused("invalid_request", "content_b64 must be base64")
        if len(data) > MAX_WRITE_BYTES:
            raise Refused("too_large", f"at most {MAX_WRITE_BYTES} bytes per write")
        mode = payload.get("mode", "overwrite")
        if mode not in ("create", "overwrite"):
            raise Refused("invalid_request", "mode is create or overwrite")
        existed = target.exists()
        if existed and (mode == "create" or not target.is_file()):
            raise Refused("exists", "the file exists (mode create)" if mode == "create" else "the path is not a file")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.yimi-tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
        return {"path": self.relative(target), "size": len(data), "sha256": sha256(target.read_bytes()), "created": not existed}

    def op_list_dir(self, payload: dict[str, Any]) -> dict[str, Any]:
        target = self.resolve(payload.get("path", "."), allow_root=True)
        if not target.is_dir():
            raise Refused("not_found", "no such directory")
        children = sorted(p for p in target.iterdir() if p.name not in (APP_STATE, DESKTOP_STATE) and not p.name.endswith(".yimi-tmp"))
        entries = []
        for child in children[:MAX_ENTRIES]:
            kind = "dir" if child.is_dir() else "file" if child.is_file() else "other"
            entries.append({"name": child.name, "kind": kind, "size": child.stat().st_size if kind == "file" else None})
        return {"path": self.relative(target), "entries": entries, "total": len(children), "truncated": len(children) > MAX_ENTRIES}

    def op_run_command(self, payload: dict[str, Any]) -> dict[str, Any]:
        argv = payload.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\x00" not in a for a in argv) or len(argv) > 64:
            raise Refused("invalid_request", "argv is a non-empty list of at most 64 strings")
        if argv[0] not in ALLOWED_PROGRAMS:
            raise Refused("command_not_allowed", f"the simulated Mac runs only {', '.join(sorted(ALLOWED_PROGRAMS))}")
        for arg in argv[1:]:
            if "/" in arg or arg.startswith("~") or arg == "..":
                self.resolve(arg, allow_root=True)
        timeout = payload.get("timeout_seconds", COMMAND_SECONDS)
        if not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= COMMAND_SECONDS:
            raise Refused("invalid_request", f"timeout_seconds is 1 to {COMMAND_SECONDS}")
        try:
            done = subprocess.run(argv, cwd=self.root, env={"PATH": "/usr/bin:/bin"}, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise Refused("command_timeout", f"the command ran longer than {timeout} s and was killed") from None
        except FileNotFoundError:
            raise Refused("command_not_found", f"{argv[0]} is not installed") from None
        return {
            "argv": argv, "exit_code": done.returncode,
            "stdout": done.stdout[-MAX_OUTPUT_BYTES:].decode("utf-8", "replace"), "stdout_size": len(done.stdout),
            "stderr": done.stderr[-MAX_OUTPUT_BYTES:].decode("utf-8", "replace"), "stderr_size": len(done.stderr),
            "stdout_sha256": sha256(done.stdout),
        }

    def op_operate_app(self, payload: dict[str, Any]) -> dict[str, Any]:
        app, action = payload.get("app"), payload.get("action")
        if not isinstance(app, str) or not 1 <= len(app) <= 64 or action not in APP_ACTIONS:
            raise Refused("invalid_request", f"app is 1-64 characters and action one of {', '.join(APP_ACTIONS)}")
        state_file = self.root / APP_STATE
        running = set(json.loads(state_file.read_text())) if state_file.exists() else set()
        was_running = app in running
        if action == "quit":
            running.discard(app)
        else:
            running.add(app)
        state_file.write_text(json.dumps(sorted(running)))
        return {"app": app, "action": action, "was_running": was_running, "running": app in running}

    def op_screenshot(self, payload: dict[str, Any]) -> dict[str, Any]:
        png = solid_png(64, 40, (40, 90, 160))
        return {"width": 64, "height": 40, "format": "png", "size": len(png), "sha256": sha256(png),
                "image_b64": base64.b64encode(png).decode(), "simulated": True}


def solid_png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A one-colour PNG (the simulated screen)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    row = b"\x00" + bytes(rgb) * width
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(row * height)) + chunk(b"IEND", b"")
