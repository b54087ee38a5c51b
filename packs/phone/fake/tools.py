"""Fake phone: the same tools and receipts as the real server, on an in-memory phone.

The real server's code runs unchanged; only its three outside parts are replaced: the
phone service (``world.route`` over an in-memory ``World``, the API the real server
speaks over HTTP), the model (``world.scripted_answer``, deterministic) and its state
directory (a private temporary directory). Nothing leaves the process.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load(name: str, path: Path):  # noqa: ANN202 - a module
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


world = _load("phone_fake_world", HERE / "world.py")
_server = _load("phone_fake_server_tools", HERE.parent / "server" / "tools.py")

WORLD = world.World()
_server.transport = lambda method, path, body: world.route(WORLD, method, path, body)
_server.model = world.scripted_answer
_server.ROOT = Path(tempfile.mkdtemp(prefix="yimi-phone-fake-"))
TOOLS = _server.TOOLS
