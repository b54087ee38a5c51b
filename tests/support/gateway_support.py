"""Test packs for gateway tests: small, real packs written into a temporary packs dir."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

REPO_PACKS = Path(__file__).resolve().parents[2] / "packs"

DEMO_TOOLS = '''
from capabilities.packkit import ToolRegistry, effect, receipt, value

TOOLS = ToolRegistry()


@TOOLS("Read something.", {"type": "object", "properties": {"key": {"type": "string"}}})
def read(args):
    return receipt("succeeded", values=[value("answer", 42, "unit", "demo")])


@TOOLS("Note something in the workspace.", {"type": "object", "properties": {"text": {"type": "string"}}})
def note(args):
    return receipt("succeeded", effects=[effect("notes", "write", "verified")], retry="forbidden")


@TOOLS("Act by action.", {"type": "object", "properties": {"action": {"type": "string"}}})
def act(args):
    return receipt("succeeded")
'''


def extension(**overrides: Any) -> dict[str, Any]:
    ext = {
        "schema": 1,
        "receipt_schema": 1,
        "compat": {"platform": ">=0.1", "gateway": 1},
        "maintainer": "lead",
        "runtime": {"server": "demo", "lazy": True, "idle_timeout_seconds": 900, "host": "shared"},
        "secrets": [],
        "network": {"egress": []},
        "scopes": ["owner", "guest"],
        "tools": {
            "read": {"effect": "observe"},
            "note": {
                "effect": "workspace",
                "retry": "forbidden",
                "check_with": "read",
                "context_inject": ["idempotency_key", "run_id"],
            },
            "act": {
                "effect_by_arg": {
                    "arg": "action",
                    "map": {"look": "observe", "post": "send", "pay": "spend", "fix": "self_change", "save": "owner_data"},
                }
            },
        },
        "staging": {"fake": "fake/tools.py"},
        "tests": {"contract": "tests/contract.yaml"},
        "provenance": {"source": "tests"},
    }
    ext.update(overrides)
    return ext


def manifest(name: str = "demo", **overrides: Any) -> dict[str, Any]:
    return {"name": name, "version": "1.0.0", "description": f"{name} test pack", "extensions": {"ai.yimi.capability": extension(**overrides)}}


def write_pack(packs_dir: Path, name: str = "demo", data: dict[str, Any] | None = None, tools_py: str = DEMO_TOOLS) -> Path:
    path = packs_dir / name
    (path / "server").mkdir(parents=True, exist_ok=True)
    (path / "fake").mkdir(exist_ok=True)
    (path / "tests").mkdir(exist_ok=True)
    (path / "skills" / name).mkdir(parents=True, exist_ok=True)
    (path / "plugin.json").write_text(json.dumps(data or manifest(name)))
    (path / "server" / "tools.py").write_text(tools_py)
    (path / "fake" / "tools.py").write_text(tools_py)
    (path / "tests" / "contract.yaml").write_text("cases: []\n")
    (path / "skills" / name / "SKILL.md").write_text(f"# {name}\n")
    return path


def copy_repo_pack(packs_dir: Path, name: str) -> Path:
    return Path(shutil.copytree(REPO_PACKS / name, packs_dir / name))


def deep(data: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(data)


def run_with_demo_pack(device: Any, tmp_path: Path, settings: Any) -> Any:
    """A run of ``device`` ("please do it") with the demo pack as the only pack."""
    from brain.models import Run
    from brain.services import accept_utterance
    from tests.conftest import new_client_id

    directory = tmp_path / "packs"
    directory.mkdir()
    write_pack(directory, "demo")
    settings.YIMI_PACKS_DIR = directory
    accepted = accept_utterance(device, new_client_id(), "please do it")
    return Run.objects.get(id=accepted.run_id)
