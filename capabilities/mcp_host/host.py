"""The pack host: an MCP server over stdio that serves the tools of one or more packs.

    python -m capabilities.mcp_host.host --packs-dir DIR --select shared [--fake]
    python -m capabilities.mcp_host.host --packs-dir DIR --select PACK     # a dedicated host

``shared`` serves every valid pack whose manifest says ``runtime.host: shared``; a pack
name serves that pack alone. Each pack's tools come from ``server/tools.py`` (or, with
``--fake``, from the module named by ``staging.fake``), a module with a
``TOOLS = ToolRegistry()`` whose names must equal the manifest's. Tools are exposed as
``{pack}__{tool}`` with the receipt in ``structured_content``. The per-call capability the
platform sends in a call's ``_meta`` is what that call's handler (and only it) presents
when it calls back into the platform (``packkit.platform_call``).

The host polls the packs directory; when the set of tools it serves changes it sends
``notifications/tools/list_changed``, so clients refresh without a restart.

A pack started without a secret it declares (one not granted to it: ``secret_grants.py``)
is not run: each call of its tools gets a failed receipt ``secret_not_granted`` naming the
secrets it lacks.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server

from capabilities.manifest import SEPARATOR, ManifestError, Pack, _signature, load_pack
from capabilities.mcp_host import egress_shim
from capabilities.mcp_host import limits as pack_limits
from capabilities.mcp_host.secret_grants import NOT_GRANTED, not_granted_message, withheld_from_env
from capabilities.packkit import CAPABILITY_META_KEY, ToolRegistry, ToolSpec, receipt, run_with_capability


def load_tools_module(pack: Pack, fake: bool) -> ToolRegistry:
    rel = pack.ext["staging"]["fake"] if fake else "server/tools.py"
    path = pack.path / rel
    spec = importlib.util.spec_from_file_location(f"yimi_pack_{pack.name}_{'fake' if fake else 'real'}", path)
    if spec is None or spec.loader is None:
        raise ManifestError(f"cannot import {rel}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    registry = getattr(module, "TOOLS", None)
    if not isinstance(registry, ToolRegistry):
        raise ManifestError(f"{rel} defines no TOOLS = ToolRegistry()")
    declared, served = set(pack.tools), set(registry.tools)
    if declared != served:
        raise ManifestError(f"{rel} serves {sorted(served)} but the manifest declares {sorted(declared)}")
    return registry


class PackHost:
    def __init__(self, packs_dir: Path, select: str, fake: bool) -> None:
        self.packs_dir, self.select, self.fake = packs_dir, select, fake
        self.tools: dict[str, ToolSpec] = {}
        self.refused: dict[str, str] = {}
        self.signature: tuple = ()
        self.session: Any = None
        self.withheld = withheld_from_env(os.environ)  # pack → declared secrets it was not granted
        self.limits: pack_limits.PackLimits | None = None  # set by main() once applied
        self.count_tasks = True

    def reload(self) -> bool:
        """Re-read the packs this host serves; True if the set of tools changed."""
        self.signature = _signature(self.packs_dir)
        tools: dict[str, ToolSpec] = {}
        refused: dict[str, str] = {}
        names = [n for n, _ in self.signature] if self.select == "shared" else [self.select]
        for name in names:
            path = self.packs_dir / name
            if not (path / "plugin.json").exists():
                continue
            try:
                pack = load_pack(path)
                if self.select == "shared" and pack.host != "shared":
                    continue
                registry = load_tools_module(pack, self.fake)
            except Exception as exc:  # noqa: BLE001 - a broken pack must not take the host down
                refused[name] = str(exc)
                continue
            for tool_name, spec in registry.tools.items():
                tools[f"{pack.name}{SEPARATOR}{tool_name}"] = spec
        changed = set(tools) != set(self.tools)
        self.tools, self.refused = tools, refused
        for name, reason in refused.items():
            print(json.dumps({"event": "pack_refused", "pack": name, "reason": reason}), file=sys.stderr)
        return changed

    async def list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        self.session = ctx.session
        return types.ListToolsResult(
            tools=[
                types.Tool(name=name, description=spec.description, input_schema=spec.input_schema)
                for name, spec in sorted(self.tools.items())
            ]
        )

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        self.session = ctx.session
        spec = self.tools.get(params.name)
        if spec is None:
            return _error(f"unknown tool {params.name}")
        pack_name = params.name.split(SEPARATOR, 1)[0]
        if pack_name in self.withheld:
            return _receipt(_not_granted(pack_name, self.withheld[pack_name]))
        capability = (params.meta or {}).get(CAPABILITY_META_KEY)
        try:
            result = await anyio.to_thread.run_sync(
                run_with_capability, spec.handler, dict(params.arguments or {}), capability if isinstance(capability, str) else None
            )
        except Exception as exc:  # noqa: BLE001 - reported to the caller, never a success
            hit = pack_limits.limit_hit(exc, self.limits, count_tasks=self.count_tasks) if self.limits else None
            if hit is not None:  # the manager ends the call with the limit's code and restarts this host
                return _error(f"{pack_limits.CODES[hit]}: {type(exc).__name__}: {exc}", {pack_limits.META_LIMIT: hit})
            return _error(f"{type(exc).__name__}: {exc}")
        if not isinstance(result, dict):
            return _error("the tool returned no receipt")
        return _receipt(result)

    async def watch(self, interval: float) -> None:
        while True:
            await anyio.sleep(interval)
            if _signature(self.packs_dir) != self.signature and self.reload() and self.session is not None:
                await self.session.send_tool_list_changed()


def _receipt(result: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(result, ensure_ascii=False))],
        structured_content=result, _meta=_meta(),
    )


def _not_granted(pack: str, secrets: list[str]) -> dict[str, Any]:
    """The receipt of a call the host did not run: its pack lacks secrets it declares."""
    message = not_granted_message(pack, secrets)
    return receipt("failed", summary=message[:2000], retry="forbidden", error=(NOT_GRANTED, message[:1000]))


def _error(message: str, meta: dict[str, Any] | None = None) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True, _meta=_meta(meta))


def _meta(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every result says how much CPU time this host has used (its ``RLIMIT_CPU`` counts it)."""
    return {pack_limits.META_CPU: round(time.process_time(), 3), **(extra or {})}


async def serve(host: PackHost, interval: float) -> None:
    server = Server("yimi-pack-host", on_list_tools=host.list_tools, on_call_tool=host.call_tool)
    options = server.create_initialization_options(notification_options=NotificationOptions(tools_changed=True))
    async with stdio_server() as (read, write), anyio.create_task_group() as tg:
        tg.start_soon(host.watch, interval)
        await server.run(read, write, options)
        tg.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packs-dir", required=True, type=Path)
    parser.add_argument("--select", required=True, help="'shared' or a pack name (dedicated)")
    parser.add_argument("--fake", action="store_true", help="serve each pack's fake implementation")
    parser.add_argument("--watch-interval", type=float, default=1.0)
    parser.add_argument("--limits", help="the host's limits as JSON (mcp_host/limits.py), set before any pack code loads")
    parser.add_argument("--no-process-rlimit", action="store_true", help="the host shares the platform's user namespace")
    args = parser.parse_args(argv)
    limits = pack_limits.PackLimits.from_json(args.limits) if args.limits else None
    if limits is not None:
        pack_limits.apply(limits, processes=not args.no_process_rlimit)
    egress_shim.start()  # the way to the egress proxy, when the packs declare egress
    host = PackHost(args.packs_dir.resolve(), args.select, args.fake)
    host.limits, host.count_tasks = limits, not args.no_process_rlimit
    host.reload()
    anyio.run(serve, host, args.watch_interval)


if __name__ == "__main__":
    main()
