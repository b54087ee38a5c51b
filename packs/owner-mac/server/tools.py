"""The owner-mac pack: Yimi's hands on the owner's own Mac, through its paired device.

Every tool is one operation relayed by the platform (``POST /internal/mac/op/`` on the
platform socket, with the capability of the call being executed; docs/protocol.md, "The Mac
relay"): the platform seals it to the Mac's key, the Mac runs it and answers with a signed,
sealed result. This server never talks to the Mac and holds no key.

Receipts say what the Mac reported: reads have no effects; a write is ``verified`` when the
SHA-256 the Mac read back equals the SHA-256 of what was sent; a command and an application
action are ``service_ack`` (the Mac says it ran them, with the exit code). Refusals:
``paused`` (the owner paused Yimi's Mac operations), ``mac_offline`` (no Mac took it: nothing
was done) and the Mac's own (``path_outside_sandbox``, ``not_found``, ...) are ``failed``;
``mac_timeout`` and a lost platform connection are ``unknown`` (the Mac may have done it).
The fake (``fake/tools.py``) runs these same handlers against a sandbox directory of its own.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from capabilities.packkit import PlatformLost, PlatformNotConfigured, ToolRegistry, effect, platform_call, receipt, value

TOOLS = ToolRegistry()
SOURCE = "owner's Mac"
RELAY_TIMEOUT_SECONDS = 45.0  # the platform waits up to 5 s for the Mac to take an op and 30 s for its result

PATH = {"type": "string", "minLength": 1, "maxLength": 1024, "description": "a path on the Mac, relative to the folder Yimi may use"}
READ_SCHEMA = {"type": "object", "properties": {"path": PATH}, "required": ["path"]}
WRITE_SCHEMA = {
    "type": "object",
    "properties": {
        "path": PATH,
        "content": {"type": "string", "maxLength": 24576, "description": "the file's new text (UTF-8)"},
        "mode": {"type": "string", "enum": ["create", "overwrite"], "description": "create refuses an existing file (default overwrite)"},
    },
    "required": ["path", "content"],
}
LIST_SCHEMA = {"type": "object", "properties": {"path": {**PATH, "description": "a directory (default: the top folder)"}}}
COMMAND_SCHEMA = {
    "type": "object",
    "properties": {
        "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 64,
                 "description": "the program and its arguments (no shell), e.g. [\"ls\", \"-l\"]"},
        "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": 20},
    },
    "required": ["argv"],
}
APP_SCHEMA = {
    "type": "object",
    "properties": {"app": {"type": "string", "minLength": 1, "maxLength": 64}, "action": {"type": "string", "enum": ["open", "activate", "quit"]}},
    "required": ["app", "action"],
}
SCREENSHOT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


class Refusal(Exception):
    def __init__(self, code: str, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


def relay(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The Mac's result for one operation, through the platform; ``Refusal`` when refused."""
    status, body = platform_call("POST", "mac/op/", {"kind": kind, "payload": payload}, timeout=RELAY_TIMEOUT_SECONDS)
    if status == 200 and isinstance(body, dict) and isinstance(body.get("result"), dict):
        return body["result"]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        raise Refusal(str(error.get("code", "platform_error")), str(error.get("message", "")), status)
    raise Refusal("platform_error", f"the platform answered HTTP {status}", status)


def call(kind: str, payload: dict[str, Any]) -> dict[str, Any] | tuple[dict[str, Any]]:
    """The result, or (a receipt,) that says why there is none."""
    try:
        result = relay(kind, payload)
    except PlatformLost as exc:
        return (receipt("unknown", summary=f"the Mac operation's outcome is unknown: {exc}", error=(exc.code, str(exc))),)
    except PlatformNotConfigured as exc:
        return (receipt("failed", summary=str(exc), retry="forbidden", error=("not_configured", str(exc))),)
    except Refusal as exc:
        if exc.code == "mac_timeout":
            return (receipt("unknown", summary="the Mac took the operation but sent no result in time", error=(exc.code, exc.message)),)
        retry = "allowed" if exc.code == "mac_offline" else "forbidden"
        return (receipt("failed", summary=refusal_summary(exc.code), retry=retry, error=(exc.code, exc.message)),)
    if result.get("status") != "ok":
        code = str(result.get("code", "mac_error"))
        return (receipt("failed", summary=refusal_summary(code), retry="forbidden", error=(code, str(result.get("message", "")))),)
    return result


def refusal_summary(code: str) -> str:
    return {
        "paused": "The owner paused Yimi's operations on the Mac; nothing was done.",
        "mac_offline": "The owner's Mac is not connected; nothing was done.",
        "path_outside_sandbox": "That path is outside the folder Yimi may use on the Mac.",
        "not_found": "There is no such file or folder on the Mac.",
        "command_not_allowed": "The Mac does not let Yimi run that program.",
    }.get(code, f"The Mac refused the operation ({code}).")


def text_or_b64(data: bytes) -> tuple[str, str]:
    try:
        return "utf-8", data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64", base64.b64encode(data).decode()


@TOOLS("Read a file on the owner's Mac (at most 24 KiB of it is returned).", READ_SCHEMA)
def read_file(args: dict[str, Any]) -> dict[str, Any]:
    result = call("read_file", {"path": args.get("path")})
    if isinstance(result, tuple):
        return result[0]
    data = base64.b64decode(result.get("content_b64", ""))
    encoding, content = text_or_b64(data)
    return receipt(
        "succeeded", summary=f"Read {result['path']} on the Mac.",
        values=[value("size", result["size"], "byte", SOURCE), value("truncated", bool(result["truncated"]), None, SOURCE)],
        content={"text": content if encoding == "utf-8" else "", "items": [
            {"path": result["path"], "size": result["size"], "sha256": result["sha256"], "truncated": result["truncated"],
             "encoding": encoding, "content": content}]},
    )


@TOOLS("Write a text file on the owner's Mac (create, or overwrite by default).", WRITE_SCHEMA)
def write_file(args: dict[str, Any]) -> dict[str, Any]:
    content = args.get("content")
    if not isinstance(content, str):
        return receipt("failed", summary="content must be text", retry="forbidden", error=("invalid_request", "content must be a string"))
    data = content.encode("utf-8")
    payload = {"path": args.get("path"), "content_b64": base64.b64encode(data).decode(), "mode": args.get("mode", "overwrite")}
    result = call("write_file", payload)
    if isinstance(result, tuple):
        return result[0]
    verified = result.get("sha256") == hashlib.sha256(data).hexdigest()
    return receipt(
        "succeeded", summary=f"Wrote {result['path']} on the Mac.",
        effects=[effect(f"mac:{result['path']}", "write", "verified" if verified else "not_verified")],
        values=[value("bytes_written", result["size"], "byte", SOURCE), value("created", bool(result["created"]), None, SOURCE)],
        content={"items": [{"path": result["path"], "size": result["size"], "sha256": result["sha256"], "created": result["created"]}]},
    )


@TOOLS("List a folder on the owner's Mac (names, kinds and sizes; at most 200 entries).", LIST_SCHEMA)
def list_dir(args: dict[str, Any]) -> dict[str, Any]:
    result = call("list_dir", {"path": args.get("path", ".")})
    if isinstance(result, tuple):
        return result[0]
    return receipt(
        "succeeded", summary=f"Listed {result['path']} on the Mac.",
        values=[value("entries", result["total"], "entry", SOURCE)],
        content={"items": result["entries"], "text": "\n".join(e["name"] + ("/" if e["kind"] == "dir" else "") for e in result["entries"])},
    )


@TOOLS("Run a program on the owner's Mac (an argv, no shell; its exit code and the end of its output come back).", COMMAND_SCHEMA)
def run_command(args: dict[str, Any]) -> dict[str, Any]:
    payload: dict[str, Any] = {"argv": args.get("argv")}
    if "timeout_seconds" in args:
        payload["timeout_seconds"] = args["timeout_seconds"]
    result = call("run_command", payload)
    if isinstance(result, tuple):
        return result[0]
    return receipt(
        "succeeded", summary=f"Ran {result['argv'][0]} on the Mac: exit code {result['exit_code']}.",
        effects=[effect("mac:command", "run", "service_ack")],
        values=[value("exit_code", result["exit_code"], "exit_code", SOURCE), value("stdout_size", result["stdout_size"], "byte", SOURCE)],
        content={"text": result["stdout"], "items": [{"argv": result["argv"], "exit_code": result["exit_code"], "stderr": result["stderr"]}]},
    )


@TOOLS("Open, bring to the front (activate) or quit an application on the owner's Mac.", APP_SCHEMA)
def operate_app(args: dict[str, Any]) -> dict[str, Any]:
    result = call("operate_app", {"app": args.get("app"), "action": args.get("action")})
    if isinstance(result, tuple):
        return result[0]
    return receipt(
        "succeeded", summary=f"{result['action'].capitalize()} {result['app']} on the Mac.",
        effects=[effect(f"app:{result['app']}", result["action"], "service_ack")],
        values=[value("running", bool(result["running"]), None, SOURCE)],
        content={"items": [{"app": result["app"], "action": result["action"], "was_running": result["was_running"], "running": result["running"]}]},
    )


@TOOLS("Take a screenshot of the owner's Mac (a PNG, returned as base64).", SCREENSHOT_SCHEMA)
def screenshot(args: dict[str, Any]) -> dict[str, Any]:
    result = call("screenshot", {})
    if isinstance(result, tuple):
        return result[0]
    return receipt(
        "succeeded", summary="Took a screenshot of the Mac.",
        values=[value("width", result["width"], "pixel", SOURCE), value("height", result["height"], "pixel", SOURCE),
                value("size", result["size"], "byte", SOURCE)],
        content={"items": [{"format": result["format"], "width": result["width"], "height": result["height"], "sha256": result["sha256"],
                            "image_b64": result["image_b64"], "simulated": bool(result.get("simulated", False))}]},
    )
