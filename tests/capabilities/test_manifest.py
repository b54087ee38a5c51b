from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from capabilities.manifest import load_packs, manifest_errors
from tests.support.gateway_support import REPO_PACKS, deep, manifest, write_pack


def with_tools(tools: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    data = manifest("demo", tools=tools, **overrides)
    return data


SHIPPED_PACKS = ("workspace", "messaging", "schedule", "shop", "memory", "delivery", "model_settings", "owner-mac", "phone", "erasure", "mijia", "personal", "location", "health", "desktop", "workshop", "release")
# Shipped packs whose manifest says ``enabled_by_default: false`` (on with YIMI_PACKS_ENABLE).
OFF_BY_DEFAULT: tuple[str, ...] = ("owner-mac", "phone", "mijia", "desktop", "workshop", "release")


@pytest.mark.parametrize("name", SHIPPED_PACKS)
def test_the_shipped_manifest_example_is_valid(name: str) -> None:
    """Each plugin.json the platform ships is valid by the schema, and so the example a
    pack author copies from."""
    data = json.loads((REPO_PACKS / name / "plugin.json").read_text(encoding="utf-8"))
    assert data["name"] == name and manifest_errors(data) == []


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
    assert manifest_errors(data) == [f"extensions.ai.yimi.capability: '{field}' is a required property"]


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

    assert Path(settings.YIMI_PACKS_DIR) == REPO_PACKS
    packs = load_packs(settings.YIMI_PACKS_DIR)
    assert packs.refused == {} and sorted(packs.packs) == sorted(set(SHIPPED_PACKS) - set(OFF_BY_DEFAULT))
    assert sorted(packs.disabled) == sorted(OFF_BY_DEFAULT)
    assert all(pack.tools for pack in packs.packs.values())


def test_a_pack_off_by_default_is_on_only_when_enabled_and_any_pack_can_be_turned_off(tmp_path: Path, settings: Any) -> None:
    write_pack(tmp_path, "good")
    write_pack(tmp_path, "home", manifest("home", enabled_by_default=False))
    settings.YIMI_PACKS_ENABLE, settings.YIMI_PACKS_DISABLE = [], []
    packs = load_packs(tmp_path)
    assert set(packs.packs) == {"good"} and packs.tool("home__read") is None
    assert packs.disabled == {"home": "off by default; YIMI_PACKS_ENABLE=home turns it on"}
    settings.YIMI_PACKS_ENABLE = ["home"]
    assert set(load_packs(tmp_path).packs) == {"good", "home"}
    settings.YIMI_PACKS_DISABLE = ["good", "home"]
    packs = load_packs(tmp_path)
    assert packs.packs == {} and set(packs.disabled) == {"good", "home"}


def test_a_target_is_one_argument_name_or_a_list_of_them(tmp_path: Path) -> None:
    for target in ("to", ["to", "thread"], []):
        assert manifest_errors(with_tools({"t": {"effect": "send", "target": target}})) == []
    for target in (3, [""], ["to", "to"], {"to": 1}):
        errors = manifest_errors(with_tools({"t": {"effect": "send", "target": target}}))
        assert errors and any("target" in e for e in errors), target
    assert "target is an argument name or a list of argument names" in manifest_errors(with_tools({"t": {"effect": "send", "target": 3}}))[0]
    write_pack(tmp_path, "sneaky", manifest("sneaky", tools={"t": {"effect": "send", "target": ["to", "idempotency_key"]}}))
    assert load_packs(tmp_path).refused["sneaky"] == "tools.t.target names idempotency_key, which the gateway sets itself"


def test_the_reserved_arguments_cover_every_trusted_field_of_the_gateway() -> None:
    from capabilities.manifest import RESERVED_ARGUMENTS
    from capabilities.services import OWNER_REQUESTED, PAYMENT_BUDGET, TRUSTED_FIELDS

    assert {*TRUSTED_FIELDS, OWNER_REQUESTED, PAYMENT_BUDGET} <= RESERVED_ARGUMENTS


def test_the_default_target_is_the_required_arguments_the_pack_host_listed(tmp_path: Path, monkeypatch: Any) -> None:
    from capabilities import manifest as manifest_module

    monkeypatch.setattr(manifest_module, "_LISTED_REQUIRED", {})
    write_pack(tmp_path, "demo", manifest("demo", tools={"pin": {"effect": "workspace"}, "post": {"effect": "send", "target": "to"}}))
    tools = load_packs(tmp_path).packs["demo"].tools
    assert tools["pin"].target_names() == [] and tools["post"].target_names() == ["to"]  # nothing listed yet: the tool as a whole
    manifest_module.note_listed_tools({
        "demo__pin": {"input_schema": {"type": "object", "required": ["board", "idempotency_key"]}},
        "demo__post": {"input_schema": {"type": "object", "required": ["to", "text"]}},
    })
    assert tools["pin"].target_names() == ["board"]  # reserved arguments are never a target
    assert tools["post"].target_names() == ["to"]  # a declared target wins
    assert tools["pin"].target_key({"board": "a", "note": "x"}) == tools["pin"].target_key({"board": "a", "note": "y", "extra": 1})
    assert tools["pin"].target_key({"board": "a"}) != tools["pin"].target_key({"board": "b"})
