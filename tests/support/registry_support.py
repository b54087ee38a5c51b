"""Candidate packs for the registry tests: a small, complete Yimi-built pack on disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from capabilities.registry import add_candidate
from capabilities.registry_models import PackCandidate
from tests.support.gateway_support import write_pack

HONEST_TOOLS = '''
from capabilities.packkit import ToolRegistry, receipt, value

TOOLS = ToolRegistry()


@TOOLS("Count the parcels.", {"type": "object", "properties": {}})
def count(args):
    return receipt("succeeded", values=[value("parcels", 2, "parcels", "parcel service")])
'''

CONTRACT = """pack: {name}
cases:
  - name: count
    steps:
      - tool: count
        args: {{}}
        expect: {{status: succeeded}}
"""


def candidate_manifest(name: str = "parcelcount", *, version: str = "1.0.0", **ext_overrides: Any) -> dict[str, Any]:
    ext: dict[str, Any] = {
        "schema": 1,
        "receipt_schema": 1,
        "compat": {"platform": ">=0.1", "gateway": 1},
        "maintainer": "yimi",
        "runtime": {"server": name, "lazy": True, "idle_timeout_seconds": 900, "host": "dedicated"},
        "secrets": [],
        "network": {"egress": []},
        "scopes": ["owner"],
        "tools": {"count": {"description": "Count the parcels.", "effect": "observe"}},
        "staging": {"fake": "fake/tools.py"},
        "tests": {"contract": "tests/contract.yaml"},
        "provenance": {"source": "workshop", "build": "test", "adapters": ["server/tools.py"]},
    }
    ext.update(ext_overrides)
    return {"name": name, "version": version, "description": f"{name}: a Yimi-built test pack", "extensions": {"ai.yimi.capability": ext}}


def write_candidate(
    root: Path,
    name: str = "parcelcount",
    *,
    tools_py: str = HONEST_TOOLS,
    fake_py: str | None = None,
    manifest: dict[str, Any] | None = None,
    contract: str | None = None,
    version: str = "1.0.0",
) -> Path:
    """A complete candidate directory ``root/name`` that passes the static checks."""
    path = root / name
    for sub in ("server", "fake", "tests", "scripts", f"skills/{name}"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    (path / "plugin.json").write_text(json.dumps(manifest or candidate_manifest(name, version=version), indent=2))
    (path / "mcp.json").write_text(json.dumps({"mcpServers": {name: {"command": "python3", "args": ["-m", "capabilities.mcp_host.host"]}}}))
    (path / "server" / "tools.py").write_text(tools_py)
    (path / "fake" / "tools.py").write_text(fake_py if fake_py is not None else tools_py)
    (path / "tests" / "contract.yaml").write_text(contract if contract is not None else CONTRACT.format(name=name))
    (path / "scripts" / "test.py").write_text("import subprocess, sys\nsys.exit(subprocess.call([sys.executable, '-m', 'pytest', '-q']))\n")
    (path / f"skills/{name}/SKILL.md").write_text(f"# {name}\n\nUse it to count parcels.\n")
    return path


WRITING_TOOLS = '''
import os, socket
from capabilities.packkit import ToolRegistry, effect, receipt, value

TOOLS = ToolRegistry()


@TOOLS("Count the parcels.", {"type": "object", "properties": {}})
def count(args):
    with open("/tmp/parcel-cache.json", "w") as fh:  # a read-only tool keeping a cache
        fh.write("{}")
    return receipt("succeeded", values=[value("parcels", 2, "parcels", "parcel service")])


@TOOLS("Ask the carrier.", {"type": "object", "properties": {}})
def ping(args):
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()  # the network, though none was declared
    except OSError:
        pass
    return receipt("succeeded", values=[value("carriers", 1, "carriers", "carrier")])


@TOOLS("Weigh a parcel.", {"type": "object", "properties": {}})
def weigh(args):
    return receipt("succeeded", values=[value("weight", 3, None, "scale")])  # a number without a unit


@TOOLS("Note a parcel in the workspace.", {"type": "object", "properties": {}})
def note(args):
    with open("/tmp/note.txt", "w") as fh:  # declared workspace: writing is what it says
        fh.write("noted")
    return receipt("succeeded", effects=[effect("note", "write", "verified")])
'''

HONEST_FOUR_TOOLS = '''
import os
from capabilities.packkit import ToolRegistry, effect, receipt, value

TOOLS = ToolRegistry()


@TOOLS("Count the parcels.", {"type": "object", "properties": {}})
def count(args):
    return receipt("succeeded", values=[value("parcels", 2, "parcels", "parcel service")])


@TOOLS("Ask the carrier.", {"type": "object", "properties": {}})
def ping(args):
    return receipt("succeeded", values=[value("carriers", 1, "carriers", "carrier")])


@TOOLS("Weigh a parcel.", {"type": "object", "properties": {}})
def weigh(args):
    return receipt("succeeded", values=[value("weight", 3, "kg", "scale")])


@TOOLS("Note a parcel in the workspace.", {"type": "object", "properties": {}})
def note(args):
    with open("/tmp/note.txt", "w") as fh:
        fh.write("noted")
    return receipt("succeeded", effects=[effect("note", "write", "verified")])
'''

FOUR_TOOL_CONTRACT = """cases:
  - name: each tool once
    steps:
      - {tool: count, args: {}}
      - {tool: ping, args: {}}
      - {tool: weigh, args: {}}
      - {tool: note, args: {}}
"""

FOUR_TOOLS = {
    "count": {"effect": "observe"},
    "ping": {"effect": "observe"},
    "weigh": {"effect": "observe"},
    "note": {"effect": "workspace"},
}


_HONESTY: dict[str, Any] = {}


def memo_honesty(path: Path) -> Any:
    """The real honesty check, run once per content digest in a test session (publishing
    tests hand in the same few candidates again and again)."""
    from capabilities.registry.checks import directory_digest
    from capabilities.registry.honesty import honesty_check

    digest = directory_digest(path)
    if digest not in _HONESTY:
        _HONESTY[digest] = honesty_check(path)
    return _HONESTY[digest]


SECOND_TOOLS = HONEST_TOOLS + '''

@TOOLS("The parcels that arrived today.", {"type": "object", "properties": {}})
def arrived(args):
    return receipt("succeeded", values=[value("arrived", 1, "parcels", "parcel service")])
'''
SECOND_CONTRACT = """cases:
  - name: count and arrived
    steps:
      - {tool: count, args: {}, expect: {status: succeeded}}
      - {tool: arrived, args: {}, expect: {status: succeeded}}
"""


def use_registry(tmp_path: Path, settings: Any) -> Path:
    """A platform with one shipped pack (``demo``) and a registry of its own; the
    shipped packs' directory."""
    settings.YIMI_PACK_REGISTRY_DIR = tmp_path / "registry"
    settings.YIMI_PACKS_DIR = tmp_path / "shipped"
    write_pack(settings.YIMI_PACKS_DIR, "demo")
    return settings.YIMI_PACKS_DIR


def candidate(root: Path, version: int, built_against: str | None) -> PackCandidate:
    """Version 1 serves ``count``; version 2 also ``arrived``."""
    if version == 1:
        path = write_candidate(root / "v1")
    else:
        tools = {"count": {"effect": "observe"}, "arrived": {"effect": "observe"}}
        data = candidate_manifest(version="2.0.0", tools=tools)
        path = write_candidate(root / "v2", tools_py=SECOND_TOOLS, manifest=data, contract=SECOND_CONTRACT)
    made = add_candidate(path, origin="workshop", built_against=built_against, honesty=memo_honesty)
    assert made.state == PackCandidate.State.PASSED, (made.static_report, made.honesty_report)
    return made
