"""The receipt helper for pack authors (the Python half of the pack template).

A pack's ``server/tools.py`` (and ``fake/tools.py``) declares its tools with ``@tool`` and
returns receipts built with ``receipt(...)``. It depends on nothing but the standard
library, so a pack runs in any host that puts this module on the path.

    from capabilities.packkit import tool, receipt, effect, value

    @tool("Write a file in Yimi's workspace.", {"type": "object", "properties": {...}})
    def write_file(args):
        ...
        return receipt("succeeded", effects=[effect(path, "write", "verified")],
                       values=[value("bytes_written", n, "byte", "filesystem")])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RECEIPT_SCHEMA = 1


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]
    handler: Callable[[dict[str, Any]], dict[str, Any]]


class ToolRegistry:
    def __init__(self) -> None:
        self.tools: dict[str, ToolSpec] = {}

    def __call__(self, description: str, input_schema: dict[str, Any] | None = None) -> Callable:
        def register(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[dict[str, Any]], dict[str, Any]]:
            self.tools[fn.__name__] = ToolSpec(
                fn.__name__, description, input_schema or {"type": "object", "properties": {}}, fn
            )
            return fn

        return register


def receipt(
    status: str,
    *,
    summary: str | None = None,
    effects: list[dict[str, Any]] | None = None,
    values: list[dict[str, Any]] | None = None,
    content: dict[str, Any] | None = None,
    unknowns: list[str] | None = None,
    retry: str | None = None,
    check_with: str | None = None,
    waiting_on: str | None = None,
    error: tuple[str, str] | None = None,
    task_id: str | None = None,
    revision: int | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"receipt_schema": RECEIPT_SCHEMA, "status": status}
    if summary is not None:
        body["summary"] = summary
    if effects:
        body["effects"] = effects
    if values:
        body["values"] = values
    if content is not None:
        body["content"] = content
    if unknowns:
        body["unknowns"] = unknowns
    nxt = {k: v for k, v in (("retry", retry), ("check_with", check_with), ("waiting_on", waiting_on)) if v is not None}
    if nxt:
        body["next"] = nxt
    if error is not None:
        body["error"] = {"code": error[0], "message": error[1]}
    if task_id is not None:
        body["task_id"] = task_id
    if revision is not None:
        body["revision"] = revision
    return body


def effect(target: str, action: str, verification: str) -> dict[str, Any]:
    return {"target": target, "action": action, "verification": verification}


def value(name: str, val: Any, unit: str | None, source: str) -> dict[str, Any]:
    return {"name": name, "value": val, "unit": unit, "source": source}
