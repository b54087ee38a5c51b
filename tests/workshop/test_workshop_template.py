"""Reuse vs template (flow F4): a reuse build writes only a manifest and a receipt wrapper
of at most 200 lines; a template build copies and fills the pack template, and the pack it
makes passes the registry's static checks and its own self-test in the workshop sandbox.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from capabilities.registry.checks import check_pack
from tests.conftest import need
from tests.workshop.test_workshop_sandbox import usable
from workshop.drafts import fill_template, validate_spec
from workshop.sandbox import run_sandboxed
from yimi_project.errors import YimiError

ADAPTER = '''"""Kilometres in miles: pure arithmetic."""

from capabilities.packkit import ToolRegistry, receipt, value

TOOLS = ToolRegistry()
SCHEMA = {"type": "object", "properties": {"km": {"type": "number"}}, "required": ["km"]}
KM_PER_MILE = 1.609344


@TOOLS("Kilometres in miles.", SCHEMA)
def to_miles(args):
    km = args.get("km")
    if not isinstance(km, (int, float)) or isinstance(km, bool):
        return receipt("failed", error=("invalid_request", "km is a number"), retry="forbidden")
    return receipt("succeeded", summary=f"{km} km", values=[value("miles", round(km / KM_PER_MILE, 3), "mile", "arithmetic")])
'''

SPEC: dict[str, Any] = {
    "name": "units",
    "description": "Converts kilometres to miles.",
    "tools": {"to_miles": {"description": "Kilometres in miles.", "effect": "observe"}},
    "adapter": ADAPTER,
    "skill": "Use `units__to_miles` when the owner asks how far something is in miles.",
    "contract": {"cases": [
        {"name": "ten km", "steps": [{"tool": "to_miles", "args": {"km": 10},
                                      "expect": {"status": "succeeded", "values": [{"name": "miles", "value": 6.214, "unit": "mile"}]}}]},
        {"name": "not a number", "steps": [{"tool": "to_miles", "args": {"km": "x"},
                                            "expect": {"status": "failed", "error_code": "invalid_request", "retry": "forbidden"}}]},
    ]},
}

WRAPPER = '''"""Receipt wrapper around the reused unit-converter skill (upstream/convert.py)."""

import importlib.util
from pathlib import Path

from capabilities.packkit import ToolRegistry, receipt, value

_SPEC = importlib.util.spec_from_file_location("unit_converter_upstream", Path(__file__).resolve().parent.parent / "upstream" / "convert.py")
upstream = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(upstream)
TOOLS = ToolRegistry()


@TOOLS("Convert an amount between km/mile, kg/lb, c/f.", {"type": "object", "properties": {
    "amount": {"type": "number"}, "unit_from": {"type": "string"}, "unit_to": {"type": "string"}}})
def convert(args):
    try:
        result = upstream.convert(float(args["amount"]), args["unit_from"], args["unit_to"])
    except (KeyError, TypeError, ValueError):
        return receipt("failed", error=("invalid_request", "amount, unit_from and unit_to (km/mile, kg/lb, c/f)"), retry="forbidden")
    return receipt("succeeded", values=[value("amount", round(result, 3), args["unit_to"], "unit-converter")])
'''

REUSE_SPEC: dict[str, Any] = {
    "name": "converter",
    "description": "Unit conversion, reusing the unit-converter skill.",
    "tools": {"convert": {"description": "Convert an amount between units.", "effect": "observe"}},
    "reuse": {"source": "skills", "id": "unit-converter", "wrapper": WRAPPER},
    "contract": {"cases": [
        {"name": "a marathon in miles", "steps": [{"tool": "convert", "args": {"amount": 42.195, "unit_from": "km", "unit_to": "mile"},
                                                   "expect": {"status": "succeeded", "values": [{"value": 26.219, "unit": "mile"}]}}]},
    ]},
}
UPSTREAM = Path(__file__).resolve().parents[2] / "workshop" / "indexes" / "sources" / "unit-converter"


def spec_with(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SPEC)
    spec.update(changes)
    return spec


def self_test(pack: Path) -> Any:
    return run_sandboxed([str(pack / "scripts" / "test.py")], readable=[pack], timeout=120.0)


def refused(spec: Any) -> YimiError:
    with pytest.raises(YimiError) as caught:
        validate_spec(spec)
    return caught.value


def test_a_reuse_wrapper_of_200_lines_is_accepted_and_201_refused() -> None:
    base = WRAPPER.rstrip("\n").split("\n")
    at_limit = "\n".join(base + ["# padding"] * (200 - len(base))) + "\n"
    spec = copy.deepcopy(REUSE_SPEC)
    spec["reuse"]["wrapper"] = at_limit
    assert validate_spec(spec) is spec
    spec["reuse"]["wrapper"] = at_limit + "# one more\n"
    error = refused(spec)
    assert error.code == "wrapper_too_long" and "201 lines" in error.message
    spec["reuse"]["wrapper"] = at_limit + "x = 1"  # a last line without a newline counts
    assert refused(spec).code == "wrapper_too_long"


def test_a_reuse_build_writes_no_adapter_of_its_own() -> None:
    spec = copy.deepcopy(REUSE_SPEC)
    spec["adapter"] = ADAPTER
    error = refused(spec)
    assert error.code == "invalid_spec" and "only a manifest and a receipt wrapper" in error.message


def test_bad_specs_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    assert "spend or self_change" in refused(spec_with(tools={"pay": {"effect": "spend"}})).message
    by_arg = {"act": {"effect_by_arg": {"arg": "mode", "map": {"read": "observe", "patch": "self_change"}}}}
    assert "spend or self_change" in refused(spec_with(tools=by_arg)).message
    assert refused(spec_with(name="Bad Name")).code == "invalid_spec"
    assert "non-empty list of cases" in refused(spec_with(contract={"cases": []})).message
    assert "unknown keys" in refused(spec_with(hooks={"start": "x"})).message
    with pytest.raises(YimiError):
        fill_template(spec_with(tools={"pay": {"effect": "spend"}}), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_filled_template_passes_the_static_checks(tmp_path: Path) -> None:
    pack = fill_template(copy.deepcopy(SPEC), tmp_path)
    report = check_pack(pack, origin="workshop")
    assert report.passed, report.as_json()
    manifest = json.loads((pack / "plugin.json").read_text())
    ext = manifest["extensions"]["ai.yimi.capability"]
    assert (manifest["name"], ext["maintainer"], ext["provenance"]["adapters"]) == ("units", "yimi", ["server/tools.py"])
    assert json.loads((pack / "mcp.json").read_text()) == {"mcpServers": {"units": {
        "command": "python3", "args": ["-m", "capabilities.mcp_host.host", "--packs-dir", "..", "--select", "units"]}}}
    skill = (pack / "skills" / "units" / "SKILL.md").read_text()
    assert skill.startswith("---\nname: units\ndescription: Converts kilometres to miles.\n---")
    assert "`units__to_miles` (observe): Kilometres in miles." in skill and "how far something is in miles" in skill
    for helper in ("receipt/receipt.py", "receipt/receipt.ts", "scripts/test.py", "fake/tools.py", "tests/contract.yaml"):
        assert (pack / helper).is_file()


def test_the_template_pack_passes_its_self_test_in_the_sandbox(tmp_path: Path) -> None:
    need(usable(), "the workshop sandbox (bubblewrap, writable cgroups) is needed")
    pack = fill_template(copy.deepcopy(SPEC), tmp_path)
    result = self_test(pack)
    assert result.ok, result.stdout + result.stderr
    assert "PASS ten km" in result.stdout and "PASS not a number" in result.stdout
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"pack": "units", "implementation": "fake", "passed": 2, "failed": 0}


def test_a_wrong_adapter_fails_its_self_test_with_the_reason(tmp_path: Path) -> None:
    need(usable(), "the workshop sandbox (bubblewrap, writable cgroups) is needed")
    wrong = ADAPTER.replace("KM_PER_MILE = 1.609344", "KM_PER_MILE = 1.0").replace('"mile", "arithmetic"', 'None, "arithmetic"')
    result = self_test(fill_template(spec_with(adapter=wrong), tmp_path))
    assert result.returncode == 1 and not result.ok
    assert "FAIL ten km" in result.stdout and "PASS not a number" in result.stdout
    assert "receipt violation" in result.stdout  # a number without a unit
    assert "values: nothing matches" in result.stdout


def test_a_reuse_build_wraps_the_reused_source_and_passes_its_self_test(tmp_path: Path) -> None:
    need(usable(), "the workshop sandbox (bubblewrap, writable cgroups) is needed")
    pack = fill_template(copy.deepcopy(REUSE_SPEC), tmp_path, upstream=UPSTREAM)
    assert (pack / "upstream" / "convert.py").read_text() == (UPSTREAM / "convert.py").read_text()
    assert (pack / "server" / "tools.py").read_text() == WRAPPER
    provenance = json.loads((pack / "plugin.json").read_text())["extensions"]["ai.yimi.capability"]["provenance"]
    assert provenance == {"source": "skills:unit-converter", "build": "reuse", "adapters": ["server/tools.py"]}
    assert check_pack(pack, origin="workshop").passed
    result = self_test(pack)
    assert result.ok, result.stdout + result.stderr
    assert "PASS a marathon in miles" in result.stdout


GREETER = '''import os

from capabilities.packkit import ToolRegistry, receipt

TOOLS = ToolRegistry()
GREETING = os.environ.get("GREETING", "hello")


@TOOLS("Greet someone.", {"type": "object", "properties": {"name": {"type": "string"}}})
def greet(args):
    return receipt("succeeded", summary=f"{GREETING} {args.get('name', '')}", content={"text": GREETING, "items": [{"to": args.get("name")}]})
'''


def test_the_self_test_runs_env_cases_on_a_fresh_import_and_substitutes_saved_values(tmp_path: Path) -> None:
    need(usable(), "the workshop sandbox (bubblewrap, writable cgroups) is needed")
    step = {"tool": "greet", "args": {"name": "Ada"}}
    spec = spec_with(name="greeter", tools={"greet": {"description": "Greet.", "effect": "observe"}}, adapter=GREETER, contract={"cases": [
        {"name": "default", "steps": [{**step, "save": {"word": "content.text"}, "expect": {"content_text": "hello"}}]},
        {"name": "with a variable", "env": {"GREETING": "hi"}, "steps": [{**step, "expect": {"summary_contains": "hi Ada"}}]},
        {"name": "default again", "steps": [{"tool": "greet", "args": {"name": "${word}"},
                                             "expect": {"summary_contains": "hello hello", "content_items": [{"to": "hello"}]}}]},
        {"name": "only real", "only": "real", "steps": [{**step, "expect": {"content_text": "never run on the fake"}}]},
    ]})
    result = self_test(fill_template(spec, tmp_path))
    assert result.ok, result.stdout + result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["passed"] == 3
    assert "only real" not in result.stdout
