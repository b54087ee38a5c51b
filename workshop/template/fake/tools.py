"""The pack's fake: the same tools and receipts as ``server/tools.py``, with nothing outside
the process. The workshop replaces this file with the build spec's fake; without one it is
the server itself, which is right for a pack that reaches nothing outside its process."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("yimi_workshop_server_for_fake", Path(__file__).resolve().parent.parent / "server" / "tools.py")
assert _SPEC is not None and _SPEC.loader is not None
server = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = server
_SPEC.loader.exec_module(server)

TOOLS = server.TOOLS
