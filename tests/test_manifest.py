from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from capabilities.manifest import load_packs, manifest_errors
from tests.gateway_support import deep, manifest, write_pack


def with_tools(tools: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    data = manifest("demo", tools=tools, **overrides)
    return data


def test_the_shipped_manifest_example_is_valid() -> None:
    assert manifest_errors(manifest("demo")) == []


def test_yimi_pack_may_not_declare_spend() -> None:
    errors = manifest_errors(with_tools({"buy": {"effect": "spend"}}, maintainer="yimi"))
    assert errors and "may not declare spend or self_change" in errors[0]


def test_yimi_pack_may_not_hide_self_change_in_one_effect_by_arg_branch() -> None:
    tools = {"do": {"effect_by_arg": {"arg": "action", "map": {"look": "observe", "upgrade": "self_change"}}}}
    assert manifest_errors(with_tools(tools, maintainer="yimi"))
    assert manifest_errors(with_tools(tools, maintainer="lead")) == []


def test_a_tool_declares_exactly_one_of_effect_or_effect_by_arg() -> None:
    both = {"t": {"effect": "observe", "effect_by_arg": {"arg": "a", "map": {"x": "observe"}}}}
    neither = {"t": {"retry": "allowed"}}
    assert any("exactly one of effect or effect_by_arg" in e for e in manifest_errors(with_tools(both)))
    assert any("exactly one of effect or effect_by_arg" in e for e in manifest_errors(with_tools(neither)))


def test_unknown_category_and_missing_fields_are_refused() -> None:
    assert manifest_errors(with_tools({"t": {"effect": "teleport"}}))
    data = manifest("demo")
    del data["extensions"]["ai.yimi.capability"]["provenance"]
    assert any("provenance" in e for e in manifest_errors(data))


@pytest.mark.parametrize("field", ["schema", "receipt_schema", "compat", "maintainer", "runtime", "secrets", "network", "scopes", "tools", "staging", "tests", "provenance"])
def test_every_required_field_is_required(field: str) -> None:
    data = manifest("demo")
    del data["extensions"]["ai.yimi.capability"][field]
    assert manifest_errors(data)


def test_loader_refuses_invalid_packs_with_a_reason_and_loads_the_rest(tmp_path: Path) -> None:
    write_pack(tmp_path, "good")
    bad = deep(manifest("bad"))
    bad["extensions"]["ai.yimi.capability"]["tools"]["pay"] = {"effect": "spend"}
    bad["extensions"]["ai.yimi.capability"]["maintainer"] = "yimi"
    write_pack(tmp_path, "bad", bad)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "plugin.json").write_text("{nope")
    wrong_check = manifest("checker", tools={"t": {"effect": "observe", "check_with": "missing"}})
    write_pack(tmp_path, "checker", wrong_check)
    packs = load_packs(tmp_path)
    assert set(packs.packs) == {"good"}
    assert "may not declare spend" in packs.refused["bad"]
    assert "not valid JSON" in packs.refused["broken"]
    assert "not a tool of this pack" in packs.refused["checker"]


def test_loader_sees_a_changed_manifest_without_a_restart(tmp_path: Path) -> None:
    write_pack(tmp_path, "good")
    assert load_packs(tmp_path).tool("good__read") is not None
    import json
    import os
    import time

    data = manifest("good", tools={"other": {"effect": "observe"}})
    path = tmp_path / "good" / "plugin.json"
    path.write_text(json.dumps(data))
    os.utime(path, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    packs = load_packs(tmp_path)
    assert packs.tool("good__read") is None and packs.tool("good__other") is not None


def test_the_shipped_packs_load() -> None:
    from django.conf import settings

    packs = load_packs(settings.YIMI_PACKS_DIR)
    assert "workspace" in packs.packs, packs.refused

