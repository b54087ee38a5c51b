"""Fake desktop: the real server's tools and receipts, against a Mac desktop simulated in place.

It loads ``server/tools.py`` and replaces its ``relay`` (the request to the platform, which
seals the operation to the Mac) with the simulated Mac's own executor
(``devices.mac.sandbox.MacSandbox`` and its simulated desktop, devices/mac/desktop.py, the
ones ``device_sim mac`` runs) on a fresh temporary directory: same windows, same refusals
(``not_frontmost``, ``no_window``, ``path_outside_sandbox``, ...), same result fields.
Nothing leaves that directory; there is no platform, so there is no pause and no
``mac_offline`` here.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path
from typing import Any

from devices.mac.sandbox import MacSandbox

_SPEC = importlib.util.spec_from_file_location("yimi_pack_desktop_server_for_fake", Path(__file__).resolve().parent.parent / "server" / "tools.py")
assert _SPEC is not None and _SPEC.loader is not None
server = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = server
_SPEC.loader.exec_module(server)

TOOLS = server.TOOLS
SANDBOX = MacSandbox(Path(tempfile.mkdtemp(prefix="yimi-fake-desktop-")))


def relay(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    result = SANDBOX.execute(kind, payload)
    return {"op_id": "fake", **result}


server.relay = relay
