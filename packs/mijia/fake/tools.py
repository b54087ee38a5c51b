"""Fake mijia: the same six tools and receipts, on in-memory devices (nothing leaves the
process). A lamp 台灯 (off, 50 %, 4000 K), a plug 插座 (on) and a door lock 门锁 (locked,
battery 87 %), as the tests' miIO device server holds them; bindings live in memory."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from capabilities.packkit import ToolRegistry

_spec = importlib.util.spec_from_file_location("mijia_server_tools", Path(__file__).resolve().parent.parent / "server" / "tools.py")
assert _spec is not None and _spec.loader is not None
_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_server)

TOOLS = ToolRegistry()
TOKEN = "00112233445566778899aabbccddeeff"
MODELS = {"lamp": "yeelink.light.lamp1", "plug": "chuangmi.plug.m1", "lock": "lumi.lock.mcn01"}
SETTERS = {"set_power": "power", "set_bright": "bright", "set_ct_abx": "ct"}


class MemoryTransport:
    def __init__(self) -> None:
        self.state: dict[str, dict[str, Any]] = {
            "台灯": {"power": "off", "bright": 50, "ct": 4000},
            "插座": {"power": "on"},
            "门锁": {"lock_state": "locked", "battery": 87},
        }

    def send(self, device: Any, method: str, params: list[Any]) -> Any:
        state = self.state[device.name]
        if method == "miIO.info":
            return {"model": MODELS[device.kind], "fw_ver": "1.0.0_fake"}
        if method == "get_prop":
            return [state.get(p) for p in params]
        key = SETTERS.get(method)
        if key is None or key not in state:
            raise _server.DeviceRefused(-5001, f"method {method} not supported")
        state[key] = params[0]
        return ["ok"]


class MemoryBindings:
    def __init__(self) -> None:
        self.data: dict[str, dict[str, Any]] = {}

    def read(self) -> dict[str, dict[str, Any]]:
        return {k: dict(v) for k, v in self.data.items()}

    def write(self, data: dict[str, dict[str, Any]]) -> None:
        self.data = {k: dict(v) for k, v in data.items()}


DEVICES = [_server.HomeDevice(name, kind, "fake", TOKEN) for name, kind in (("台灯", "lamp"), ("插座", "plug"), ("门锁", "lock"))]
HOME = _server.Home(MemoryTransport(), MemoryBindings(), lambda: list(DEVICES))
_server.register(TOOLS, lambda: HOME)
