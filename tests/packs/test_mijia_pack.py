"""The mijia pack: python-miio over real UDP against a local miIO device server
(tests/support/miio_fake.py: a lamp, a plug and a door lock), the contract against the real server
and the fake, a wrong token refused by the device, and door locks read-only in the pack
and at the gateway."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capabilities.contract import run_contract
from capabilities.manifest import load_pack
from tests.support.miio_fake import FakeMiioHome

PACKS = Path(__file__).resolve().parents[2] / "packs"


def report_text(report: Any) -> str:
    lines = [f"{report.pack} ({report.implementation}): errors={report.errors}"]
    for case in report.cases:
        lines.append(f"  {'pass' if case.passed else 'FAIL'} {case.name}")
        lines.extend(f"      {f}" for f in case.failures)
    return "\n".join(lines)


def secrets_for(root: Path, home: FakeMiioHome, **tokens: str) -> Path:
    secrets = root / "secrets"
    secrets.mkdir(exist_ok=True)
    (secrets / "MIJIA_DEVICES").write_text(home.secret(tokens=tokens) + "\n", encoding="utf-8")
    return secrets


@pytest.fixture
def home() -> Iterator[FakeMiioHome]:
    with FakeMiioHome.standard() as running:
        yield running


@pytest.fixture
def server(home: FakeMiioHome, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The pack's real server module in this process, its secret and own directory set."""
    monkeypatch.setenv("MIJIA_DEVICES", home.secret())
    monkeypatch.setenv("YIMI_PACKS_DATA_DIR", str(tmp_path / "packs-data"))
    import importlib.util

    spec = importlib.util.spec_from_file_location("mijia_server_under_test", PACKS / "mijia" / "server" / "tools.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def call(server: Any, name: str, **args: Any) -> dict[str, Any]:
    return server.TOOLS.tools[name].handler(args)


def test_manifest_declares_six_tools_off_by_default_with_the_tokens_secret() -> None:
    pack = load_pack(PACKS / "mijia")
    assert len(pack.tools) == 6 and pack.ext["enabled_by_default"] is False
    assert pack.secrets == ["MIJIA_DEVICES"] and pack.egress
    cats = {name: {t.resolve_category({"state": "on", "property": "brightness", "action": a}) for a in ("status", "list", "bind")}
            for name, t in pack.tools.items()}
    assert cats["devices"] == cats["status"] == {"observe"}
    assert cats["switch"] == cats["set"] == {"physical"}
    assert cats["account"] == {"observe", "account", None}  # "status" is no account action: unmapped
    # lock ops are physical with the door_lock task type (the consent gate blocks them);
    # an unmapped switch state (unlock, open) resolves to nothing: the gateway refuses it
    assert pack.tools["lock"].resolve_category({"action": "unlock"}) == "physical" and pack.tools["lock"].task_type == "door_lock"
    assert pack.tools["switch"].resolve_category({"state": "unlock"}) is None


def test_list_and_switch_round_trip_over_udp(server: Any, home: FakeMiioHome) -> None:
    listed = call(server, "devices")
    assert listed["status"] == "succeeded"
    states = {item["name"]: item["state"] for item in listed["content"]["items"]}
    assert states == {"台灯": {"power": "off", "brightness": 50, "color_temperature": 4000}, "插座": {"power": "on"},
                      "门锁": {"lock_state": "locked", "battery": 87}}
    assert call(server, "account", device="台灯", action="bind")["status"] == "succeeded"
    switched = call(server, "switch", device="台灯", state="on")
    assert switched["status"] == "succeeded" and switched["effects"] == [{"target": "mijia:台灯", "action": "power_on", "verification": "verified"}]
    assert home.devices["lamp"].state["power"] == "on"  # the device itself changed
    assert ("set_power", ["on"]) in home.devices["lamp"].calls
    dimmed = call(server, "set", device="台灯", property="brightness", value=20)
    assert dimmed["status"] == "succeeded" and home.devices["lamp"].state["bright"] == 20


def test_a_wrong_token_is_refused_by_the_device_and_nothing_changes(home: FakeMiioHome, server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIJIA_DEVICES", home.secret(tokens={"plug": "0" * 32}))
    bound = call(server, "account", device="插座", action="bind")
    assert (bound["status"], bound["error"]["code"]) == ("failed", "token_rejected")
    assert home.devices["plug"].rejected >= 1 and not home.devices["plug"].calls  # dropped, never executed
    server.Bindings().write({"插座": {"model": "chuangmi.plug.m1", "kind": "plug"}})  # even if it were bound
    switched = call(server, "switch", device="插座", state="off")
    assert (switched["status"], switched["error"]["code"], switched["next"]["check_with"]) == ("unknown", "DISCONNECTED", "status")
    assert home.devices["plug"].state["power"] == "on" and not home.devices["plug"].calls


@pytest.mark.parametrize("tool,args", [
    ("switch", {"device": "门锁", "state": "off"}),
    ("switch", {"device": "门锁", "state": "unlock"}),
    ("set", {"device": "门锁", "property": "brightness", "value": 10}),
    ("lock", {"device": "门锁", "action": "unlock"}),
    ("lock", {"device": "门锁", "action": "lock"}),
])
def test_the_pack_never_writes_to_a_door_lock_whatever_the_arguments(server: Any, home: FakeMiioHome, tool: str, args: dict[str, Any]) -> None:
    server.Bindings().write({"门锁": {"model": "lumi.lock.mcn01", "kind": "lock"}})
    result = call(server, tool, **args)
    assert (result["status"], result["error"]["code"]) == ("failed", "read_only_device")
    assert home.devices["lock"].state["lock_state"] == "locked"
    assert not [c for c in home.devices["lock"].calls if c[0] != "get_prop" and c[0] != "miIO.info"]


def test_a_lock_declared_as_a_plug_is_still_refused_by_its_model(server: Any, home: FakeMiioHome, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = json.loads(home.secret())
    for row in rows:
        if row["name"] == "门锁":
            row["kind"] = "plug"
    monkeypatch.setenv("MIJIA_DEVICES", json.dumps(rows))
    server.Bindings().write({"门锁": {"model": "?", "kind": "plug"}})
    result = call(server, "switch", device="门锁", state="off")
    assert result["error"]["code"] == "read_only_device" and home.devices["lock"].state["lock_state"] == "locked"
    assert [c[0] for c in home.devices["lock"].calls] == ["miIO.info"]


def test_contract_real_against_the_miio_device_server(tmp_path: Path, home: FakeMiioHome) -> None:
    from capabilities.mcp_host.sandbox import PlatformPaths

    paths = PlatformPaths(tmp_path / "data", tmp_path / "w", tmp_path / "m", secrets_for(tmp_path, home), None)
    report = run_contract(PACKS / "mijia", fake=False, paths=paths)
    assert report.passed, report_text(report)
    assert len(report.cases) == 2 and not report.skipped
    assert home.devices["lamp"].state == {"power": "on", "bright": 30, "ct": 4000}  # the sandboxed pack reached the device
    assert home.devices["lock"].state["lock_state"] == "locked"


def test_contract_fake() -> None:
    report = run_contract(PACKS / "mijia", fake=True)
    assert report.passed, report_text(report)


@pytest.mark.django_db
def test_pack_contract_command_both(tmp_path: Path, home: FakeMiioHome, settings: Any, capsys: Any) -> None:
    from django.core.management import call_command

    settings.SECRETS_DIR = secrets_for(tmp_path, home)
    call_command("pack_contract", "mijia", "--both")
    out = capsys.readouterr().out
    assert "mijia  real  pass" in out and "mijia  fake  pass" in out and "2/2 contract runs passed" in out, out


# --- at the gateway: lock operations refused before the pack runs, physical asks a card ------


@pytest.fixture
def mijia_run(make_device: Any, tmp_path: Path, settings: Any) -> Any:
    from brain.models import Run
    from brain.services import accept_utterance
    from tests.conftest import new_client_id
    from tests.support.gateway_support import copy_repo_pack

    packs = tmp_path / "packs"
    packs.mkdir()
    copy_repo_pack(packs, "mijia")
    settings.YIMI_PACKS_DIR = packs
    settings.YIMI_PACKS_ENABLE = ["mijia"]
    accepted = accept_utterance(make_device().device, new_client_id(), "把家里的灯打开")
    return Run.objects.get(id=accepted.run_id)


def decide_on(run: Any, tool: str, **args: Any) -> Any:
    from capabilities.services import CallRequest, decide

    return decide(CallRequest(str(run.id), f"mijia__{tool}", args))


@pytest.mark.django_db
@pytest.mark.parametrize("tool,args,code", [
    ("lock", {"device": "门锁", "action": "unlock", "owner_requested": True}, "door_locks_read_only"),
    ("lock", {"device": "门锁", "action": "lock"}, "door_locks_read_only"),
    ("switch", {"device": "门锁", "state": "unlock", "owner_requested": True}, "category_unresolved"),
    ("set", {"device": "门锁", "property": "lock_state", "value": 0}, "category_unresolved"),
])
def test_the_gateway_refuses_lock_operations_whatever_the_owner_requested(mijia_run: Any, tool: str, args: dict[str, Any], code: str) -> None:
    from consent.models import ConsentCard

    decision = decide_on(mijia_run, tool, **args)
    assert (decision.decision, decision.code) == ("block", code)
    assert ConsentCard.objects.count() == 0


@pytest.mark.django_db
def test_a_physical_switch_the_owner_did_not_request_asks_a_card_and_reads_pass(mijia_run: Any) -> None:
    from consent.models import ConsentCard

    asked = decide_on(mijia_run, "switch", device="台灯", state="on")
    assert (asked.decision, asked.category) == ("ask", "physical") and asked.card_id
    card = ConsentCard.objects.get(id=asked.card_id)
    assert (card.category, card.tool) == ("physical", "mijia__switch")
    assert decide_on(mijia_run, "lock", action="status").decision == "allow"  # reading a lock is observe
    assert decide_on(mijia_run, "devices").decision == "allow"


@pytest.mark.django_db
def test_the_pack_is_off_unless_enabled(mijia_run: Any, settings: Any) -> None:
    settings.YIMI_PACKS_ENABLE = []
    decision = decide_on(mijia_run, "devices")
    assert decision.decision == "block"
