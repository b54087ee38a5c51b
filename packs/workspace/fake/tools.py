"""Fake workspace: the same tools and receipts, kept in memory (nothing touches disk)."""

from __future__ import annotations

from typing import Any

from capabilities.packkit import ToolRegistry, effect, receipt, value

TOOLS = ToolRegistry()
FILES: dict[str, bytes] = {}
PATH_SCHEMA = {"type": "string", "minLength": 1, "maxLength": 255}


def valid(rel: Any) -> bool:
    return isinstance(rel, str) and bool(rel) and not rel.startswith("/") and ".." not in rel.split("/") and "\x00" not in rel


def invalid_path(rel: Any) -> dict[str, Any]:
    return receipt("failed", summary=f"{rel!r} is not a path inside the workspace", retry="forbidden",
                   error=("invalid_path", "paths are relative and stay inside the workspace"))


@TOOLS("Write a text file (UTF-8) at a relative path in the workspace, replacing it.",
       {"type": "object", "properties": {"path": PATH_SCHEMA, "content": {"type": "string"}}, "required": ["path", "content"]})
def write_file(args: dict[str, Any]) -> dict[str, Any]:
    rel, content = args.get("path"), args.get("content")
    if not valid(rel):
        return invalid_path(rel)
    if not isinstance(content, str):
        return receipt("failed", summary="content must be text", retry="forbidden", error=("invalid_content", "content must be a string"))
    data = content.encode("utf-8")
    if len(data) > 1024 * 1024:
        return receipt("failed", summary="the file is larger than 1 MiB", retry="forbidden", error=("too_large", "at most 1 MiB"))
    FILES[rel] = data
    return receipt("succeeded", summary=f"wrote {rel}", effects=[effect(rel, "write", "verified")],
                   values=[value("bytes_written", len(data), "byte", "workspace file system")], retry="allowed")


@TOOLS("Read a text file from the workspace.",
       {"type": "object", "properties": {"path": PATH_SCHEMA}, "required": ["path"]})
def read_file(args: dict[str, Any]) -> dict[str, Any]:
    rel = args.get("path")
    if not valid(rel):
        return invalid_path(rel)
    if rel not in FILES:
        return receipt("failed", summary=f"{rel} does not exist", retry="allowed", error=("not_found", "no such file"))
    data = FILES[rel]
    return receipt("succeeded", summary=f"read {rel}", content={"text": data.decode("utf-8")},
                   values=[value("size", len(data), "byte", "workspace file system")])


@TOOLS("List the files in the workspace.", {"type": "object", "properties": {}})
def list_files(args: dict[str, Any]) -> dict[str, Any]:
    files = sorted(FILES)
    return receipt("succeeded", summary=f"{len(files)} files", content={"items": files},
                   values=[value("file_count", len(files), "file", "workspace file system")])
