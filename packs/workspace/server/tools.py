"""The workspace pack: files in Yimi's own workspace (``YIMI_WORKSPACE_DIR``).

Writes are atomic (temporary file, fsync, rename) and verified by reading the file back;
paths are relative and may not leave the workspace.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from capabilities.packkit import ToolRegistry, effect, receipt, value

TOOLS = ToolRegistry()
MAX_BYTES = 1024 * 1024
PATH_SCHEMA = {"type": "string", "minLength": 1, "maxLength": 255}


def workspace() -> Path:
    root = Path(os.environ.get("YIMI_WORKSPACE_DIR", "workspace")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    return root


def resolve(rel: Any) -> Path | None:
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\x00" in rel:
        return None
    root = workspace()
    path = (root / rel).resolve()
    return path if path != root and root in path.parents else None


def invalid_path(rel: Any) -> dict[str, Any]:
    return receipt("failed", summary=f"{rel!r} is not a path inside the workspace", retry="forbidden",
                   error=("invalid_path", "paths are relative and stay inside the workspace"))


@TOOLS("Write a text file (UTF-8) at a relative path in the workspace, replacing it.",
       {"type": "object", "properties": {"path": PATH_SCHEMA, "content": {"type": "string"}}, "required": ["path", "content"]})
def write_file(args: dict[str, Any]) -> dict[str, Any]:
    path, content = resolve(args.get("path")), args.get("content")
    if path is None:
        return invalid_path(args.get("path"))
    if not isinstance(content, str):
        return receipt("failed", summary="content must be text", retry="forbidden", error=("invalid_content", "content must be a string"))
    data = content.encode("utf-8")
    if len(data) > MAX_BYTES:
        return receipt("failed", summary="the file is larger than 1 MiB", retry="forbidden", error=("too_large", "at most 1 MiB"))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".write-")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    rel = str(path.relative_to(workspace()))
    verified = hashlib.sha256(path.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    return receipt(
        "succeeded",
        summary=f"wrote {rel}",
        effects=[effect(rel, "write", "verified" if verified else "not_verified")],
        values=[value("bytes_written", len(data), "byte", "workspace file system")],
        retry="allowed",
    )


@TOOLS("Read a text file from the workspace.",
       {"type": "object", "properties": {"path": PATH_SCHEMA}, "required": ["path"]})
def read_file(args: dict[str, Any]) -> dict[str, Any]:
    path = resolve(args.get("path"))
    if path is None:
        return invalid_path(args.get("path"))
    if not path.is_file():
        return receipt("failed", summary=f"{args['path']} does not exist", retry="allowed", error=("not_found", "no such file"))
    data = path.read_bytes()
    return receipt(
        "succeeded",
        summary=f"read {args['path']}",
        content={"text": data.decode("utf-8", errors="replace")},
        values=[value("size", len(data), "byte", "workspace file system")],
    )


@TOOLS("List the files in the workspace.", {"type": "object", "properties": {}})
def list_files(args: dict[str, Any]) -> dict[str, Any]:
    root = workspace()
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.name.startswith(".write-"))
    return receipt("succeeded", summary=f"{len(files)} files", content={"items": files},
                   values=[value("file_count", len(files), "file", "workspace file system")])
