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

from capabilities.packkit import MAC_SOURCE, ToolRegistry, effect, mac_call, mac_relay, receipt, value

TOOLS = ToolRegistry()
SOURCE = MAC_SOURCE

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


# The Mac's own refusals in this pack's words (``paused`` and ``mac_offline``: packkit.MAC_REFUSALS).
REFUSALS = {
    "path_outside_sandbox": "That path is outside the folder Yimi may use on the Mac.",
    "not_found": "There is no such file or folder on the Mac.",
    "command_not_allowed": "The Mac does not let Yimi run that program.",
}

# The request to the platform (packkit.mac_relay); the fake (fake/tools.py) replaces it with its simulated Mac.
relay = mac_relay


def call(kind: str, payload: dict[str, Any]) -> dict[str, Any] | tuple[dict[str, Any]]:
    """The result, or (a receipt,) that says why there is none (packkit.mac_call)."""
    return mac_call(kind, payload, REFUSALS, relay=relay)


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
