"""Fake shop: the real server's tools and receipts, on an in-memory store.

It loads ``server/tools.py`` and replaces its file store with a ``MemoryStore`` over
``STATE``, a module-level dict with the same structure, default merchant, menu and ETA as
``store.json``. Nothing touches disk and nothing is paid. The price drift comes from
``YIMI_SHOP_PRICE_DRIFT`` (comma-separated amounts in yuan), read when this module loads.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

_SPEC = importlib.util.spec_from_file_location("yimi_pack_shop_server_for_fake", Path(__file__).resolve().parent.parent / "server" / "tools.py")
assert _SPEC is not None and _SPEC.loader is not None
server = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = server
_SPEC.loader.exec_module(server)

STATE: dict[str, Any] = server.default_store(server.parse_drift(os.environ.get(server.DRIFT_ENV)))
server.STORE = server.MemoryStore(STATE)
TOOLS = server.TOOLS
