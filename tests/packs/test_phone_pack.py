"""The ``phone`` pack: cloud-phone errands against a local cloud phone speaking real HTTP
(tests/support/cloud_phone_fake.py) with a scripted model: the model loop and its step limit,
CheckoutStop with and without a payment intent, cancel (cleanup before release), the
atomic terminal file and increasing revisions, the model-phase timeout on an injected
clock, the read-only self-check, the platform's executor endpoint, and the contract."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from django.core.management import call_command

from capabilities.contract import receipt_problems, run_contract
from capabilities.manifest import load_pack
from capabilities.mcp_host.host import load_tools_module
from tests.conftest import platform_paths
from tests.support.cloud_phone_fake import CloudPhoneService

REPO_ROOT = Path(__file__).resolve().parents[2]
PACK = REPO_ROOT / "packs" / "phone"
NOTE_GOAL = "write a note: buy milk"


def report_text(report: Any) -> str:
    lines = [f"{report.pack} ({report.implementation}): errors={report.errors}"]
    for case in report.cases:
        lines.append(f"  {'pass' if case.passed else 'FAIL'} {case.name}")
        lines.extend(f"      {f}" for f in case.failures)
    return "\n".join(lines)


@pytest.fixture
def cloud() -> Iterator[CloudPhoneService]:
    with CloudPhoneService() as service:
        yield service


@pytest.fixture
def phone(cloud: CloudPhoneService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The real server module, fresh (its own tasks and clock), on the local cloud phone
    and its scripted model, with its own state directory."""
    monkeypatch.setenv("PHONE_API_URL", cloud.url)
    monkeypatch.setenv("PHONE_MODEL_URL", cloud.url + "/model")
    monkeypatch.delenv("YIMI_PLATFORM_SOCKET", raising=False)
    name = f"phone_server_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, PACK / "server" / "tools.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    module.ROOT = tmp_path / "phone"
    yield module
    sys.modules.pop(name, None)


def call(module: ModuleType, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """Call a tool in-process and check its result is a clean receipt."""
    raw = module.TOOLS.tools[tool].handler(dict(args))
    problems = receipt_problems(raw, load_pack(PACK).tools[tool], args)
    assert not problems, (tool, problems, raw)
    return raw


def events(cloud: CloudPhoneService, kind: str) -> list[tuple[str, ...]]:
    return [e for e in cloud.world.events if e[0] == kind]


class StepClock:
    """A clock that moves one second each time it is read: no wall-clock in the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


# --- the manifest ---------------------------------------------------------------------------


def test_the_phone_manifest_declares_effects_by_argument_and_ships_off() -> None:
    pack = load_pack(PACK)
    assert (pack.name, pack.host, pack.filesystem, pack.platform_api, pack.scopes) == ("phone", "dedicated", ["own"], ["executor"], ["owner"])
    assert pack.ext["enabled_by_default"] is False and len(pack.tools) == 8
    t = pack.tools
    assert {n: t[n].resolve_category({}) for n in ("devices", "read_screen", "task_status", "save_login", "restore_login")} == {
        "devices": "observe", "read_screen": "observe", "task_status": "observe", "save_login": "owner_data", "restore_login": "owner_data",
    }
    assert {k: t["start_task"].resolve_category({"kind": k}) for k in ("errand", "order", "message", "account", "ride", "delete")} == {
        "errand": "workspace", "order": "workspace", "message": "send", "account": "account", "ride": "physical", "delete": "delete",
    }
    assert [t["power"].resolve_category({"action": a}) for a in ("start", "stop")] == ["workspace", "workspace"]
    assert [t["task_control"].resolve_category({"action": a}) for a in ("cancel", "pay")] == ["workspace", "spend"]
    assert t["start_task"].resolve_category({"kind": "teleport"}) is None  # no guessed default
    assert t["start_task"].long_running and "payment_intent_id" in t["start_task"].context_inject
    for fake in (False, True):
        assert set(load_tools_module(pack, fake).tools) == set(t)


# --- the model loop ---------------------------------------------------------------------------


def test_a_task_runs_to_done_within_the_step_limit(phone: ModuleType, cloud: CloudPhoneService) -> None:
    raw = call(phone, "start_task", {"goal": NOTE_GOAL, "kind": "errand", "app": "notes", "wait_seconds": 30})
    assert raw["status"] == "succeeded", raw
    assert raw["content"]["state"] == "succeeded" and raw["content"]["steps"] == 4 <= raw["content"]["max_steps"] == 80
    assert cloud.world.devices["phone-1"].notes == [NOTE_GOAL]  # the errand really happened on the phone
    assert cloud.model_calls == 4  # one model call per step
    assert [e[0] for e in cloud.world.events] == ["lease", "tap", "input", "tap", "release"]
    assert raw["content"]["lease_released"] is True and raw["content"]["self_check"] is None


def test_step_limits_outside_1_to_120_are_refused_and_change_nothing(phone: ModuleType, cloud: CloudPhoneService) -> None:
    for steps in (0, 121, True, "80"):
        raw = call(phone, "start_task", {"goal": NOTE_GOAL, "kind": "errand", "max_steps": steps})
        assert (raw["status"], raw["error"]["code"]) == ("failed", "invalid_request")
    assert cloud.world.events == [] and cloud.model_calls == 0 and phone.TASKS == {}


def test_a_task_stops_at_its_step_limit_and_gets_one_read_only_self_check(phone: ModuleType, cloud: CloudPhoneService) -> None:
    raw = call(phone, "start_task", {"goal": "wander around", "kind": "errand", "max_steps": 3, "wait_seconds": 30})
    assert (raw["status"], raw["error"]["code"], raw["content"]["steps"]) == ("failed", "step_limit", 3)
    assert cloud.model_calls == 3
    # the self-check read the screen once and touched nothing; then the phone was released
    assert raw["content"]["self_check"] == {"read_only": True, "page": "notes", "app": "notes", "title": "Notes", "at_checkout": False}
    assert not events(cloud, "tap") and not events(cloud, "input") and cloud.world.events[-1] == ("release", "phone-1")


# --- CheckoutStop -----------------------------------------------------------------------------


def test_checkout_stop_without_an_intent_refuses_entering_the_checkout(phone: ModuleType, cloud: CloudPhoneService) -> None:
    raw = call(phone, "start_task", {"goal": "order a milk tea", "kind": "order", "app": "milktea", "wait_seconds": 30})
    assert (raw["status"], raw["error"]["code"], raw["next"]["retry"]) == ("failed", "checkout_without_intent", "forbidden")
    # the drink went into the cart; the tap on 去结算 was refused, so the phone never reached the checkout
    assert events(cloud, "tap") == [("tap", "item.oolong")] and cloud.world.devices["phone-1"].page == "menu"
    assert cloud.world.payments == [] and cloud.world.events[-1] == ("release", "phone-1")
    assert raw["content"]["self_check"] is None  # a CheckoutStop refusal is not a failure to look into


def test_checkout_stop_judges_the_tap_target_and_the_page_not_the_model(phone: ModuleType) -> None:
    checkout = {"title": "收银台", "nodes": [{"id": "pay_now", "role": "button", "text": "立即支付", "resource_id": "btn_pay"},
                                          {"id": "back", "role": "button", "text": "返回", "resource_id": "back"}]}
    menu = {"title": "Shop", "nodes": [{"id": "x", "role": "button", "text": "Go", "resource_id": "btn_checkout"},
                                       {"id": "y", "role": "button", "text": "乌龙奶茶", "resource_id": "item"}]}
    stop = phone.checkout_stop
    assert stop({"action": "tap", "node": "back"}, checkout, "") == "refuse"  # anything on a checkout page
    assert stop({"action": "tap", "node": "pay_now"}, checkout, "intent-1") == "hand_over"
    assert stop({"action": "tap", "node": "x"}, menu, "") == "refuse"  # the resource id says checkout, whatever the label
    assert stop({"action": "tap", "node": "x"}, menu, "intent-1") == "go"  # with an intent it may open the checkout
    assert stop({"action": "tap", "node": "y"}, menu, "") == "go"


def test_with_an_intent_it_stops_at_the_checkout_awaiting_payment(phone: ModuleType, cloud: CloudPhoneService) -> None:
    raw = call(phone, "start_task", {"goal": "order a milk tea", "kind": "order", "app": "milktea", "wait_seconds": 30,
                                      "payment_intent_id": "intent-1"})
    assert raw["status"] == "succeeded" and raw["content"]["state"] == "awaiting_payment"
    assert {k: raw["content"][k] for k in ("merchant", "items", "amount", "payee", "eta", "payment_intent_id")} == {
        "merchant": "奶茶小铺", "items": ["乌龙奶茶 x1"], "amount": "18.00", "payee": "milk-tea-shop", "eta": "约30分钟", "payment_intent_id": "intent-1",
    }
    assert cloud.world.payments == [] and cloud.world.devices["phone-1"].lease is not None  # same lease, for the payment flow
    task_id = raw["task_id"]
    wrong = call(phone, "task_control", {"task_id": task_id, "action": "pay", "payment_intent_id": "intent-1",
                                         "payment_authorization_id": "auth-1", "authorized_amount": "16.00"})
    assert wrong["error"]["code"] == "AMOUNT_CHANGED" and cloud.world.payments == []
    stranger = call(phone, "task_control", {"task_id": task_id, "action": "pay", "payment_intent_id": "intent-2",
                                            "payment_authorization_id": "auth-1", "authorized_amount": "18.00"})
    assert stranger["error"]["code"] == "no_authorization" and cloud.world.payments == []
    paid = call(phone, "task_control", {"task_id": task_id, "action": "pay", "payment_intent_id": "intent-1",
                                        "payment_authorization_id": "auth-2", "authorized_amount": "18.00"})
    assert paid["status"] == "succeeded" and paid["content"]["amount"] == "18.00"
    assert cloud.world.payments == [{"device": "phone-1", "amount": "18.00", "payee": "milk-tea-shop"}]
    assert cloud.world.events[-1] == ("release", "phone-1")


# --- cancel, terminal state, timeout -------------------------------------------------------------


def test_cancel_waits_for_the_tap_in_flight_then_releases_the_phone(phone: ModuleType, cloud: CloudPhoneService) -> None:
    cloud.hold_taps()
    started = call(phone, "start_task", {"goal": NOTE_GOAL, "kind": "errand", "app": "notes", "wait_seconds": 0})
    assert started["status"] == "running"
    assert cloud.tap_started.wait(10)  # the first tap is on the wire, held by the phone
    task = phone.TASKS[started["task_id"]]
    result: dict[str, Any] = {}
    canceller = threading.Thread(target=lambda: result.update(call(phone, "task_control", {"task_id": task.id, "action": "cancel"})))
    canceller.start()
    assert task.cancel.wait(10)
    assert events(cloud, "release") == []  # the tap has not returned: the phone is not released under it
    cloud.let_taps_go()
    canceller.join(15)
    assert result["status"] == "cancelled" and result["content"]["lease_released"] is True
    assert [e[0] for e in cloud.world.events] == ["lease", "tap", "release"]  # nothing after the release
    assert result["content"]["self_check"] is None  # the owner cancelled: no self-check


def test_the_terminal_state_is_written_atomically_and_revisions_increase(
    phone: ModuleType, cloud: CloudPhoneService, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = []
    real_replace, real_fsync, real_unlink = os.replace, os.fsync, Path.unlink
    monkeypatch.setattr(os, "fsync", lambda fd: (order.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (order.append(f"rename:{Path(b).name}"), real_replace(a, b))[1])
    monkeypatch.setattr(Path, "unlink", lambda self, missing_ok=False: (order.append(f"unlink:{self.name}"), real_unlink(self, missing_ok=missing_ok))[1])
    first = call(phone, "start_task", {"goal": NOTE_GOAL, "kind": "errand", "app": "notes", "wait_seconds": 30})
    folder = phone.task_dir(first["task_id"])
    # the terminal file: temporary file fsynced, renamed, directory fsynced, then the marker removed
    at = order.index("rename:terminal.json")
    assert order[at - 1:at + 3] == ["fsync", "rename:terminal.json", "fsync", "unlink:running"]
    assert not (folder / "running").exists() and not list(folder.glob("*.tmp"))
    terminal = json.loads((folder / "terminal.json").read_text(encoding="utf-8"))
    assert terminal["state"] == "succeeded" and terminal["task_id"] == first["task_id"]
    second = call(phone, "task_status", {"task_id": first["task_id"]})
    third = call(phone, "task_status", {"task_id": first["task_id"]})
    assert first["task_id"] == second["task_id"] == third["task_id"]
    assert first["revision"] < second["revision"] < third["revision"]
    # the one reader answers from the file too (a new host process: no task in memory)
    phone.TASKS.clear()
    fourth = call(phone, "task_status", {"task_id": first["task_id"]})
    assert fourth["status"] == "succeeded" and fourth["revision"] == third["revision"]


def test_a_task_whose_worker_was_lost_is_unknown_never_done(phone: ModuleType, cloud: CloudPhoneService) -> None:
    cloud.hold_taps()
    started = call(phone, "start_task", {"goal": NOTE_GOAL, "kind": "errand", "app": "notes", "wait_seconds": 0})
    assert cloud.tap_started.wait(10)
    phone.TASKS.clear()  # as after a restart of the pack's host
    raw = call(phone, "task_status", {"task_id": started["task_id"]})
    assert (raw["status"], raw["error"]["code"], raw["next"]["retry"]) == ("unknown", "TASK_LOST", "after_check")
    cloud.let_taps_go()


def test_the_model_phase_times_out_on_its_clock_then_self_checks_and_releases(phone: ModuleType, cloud: CloudPhoneService) -> None:
    phone.clock = StepClock()  # two reads a step: a 10 s phase allows a handful of steps, however fast the machine
    raw = call(phone, "start_task", {"goal": "wander around", "kind": "errand", "model_phase_seconds": 10, "wait_seconds": 30})
    assert (raw["status"], raw["error"]["code"], raw["next"]["retry"]) == ("unknown", "MODEL_PHASE_TIMEOUT", "after_check")
    assert raw["content"]["state"] == "timed_out" and 0 < raw["content"]["steps"] < 10
    assert raw["content"]["self_check"]["read_only"] is True and cloud.world.events[-1] == ("release", "phone-1")


def test_the_model_phase_is_at_most_600_seconds(phone: ModuleType, cloud: CloudPhoneService) -> None:
    raw = call(phone, "start_task", {"goal": NOTE_GOAL, "kind": "errand", "model_phase_seconds": 601})
    assert raw["error"]["code"] == "invalid_request" and cloud.world.events == []


def test_without_a_model_the_task_fails_honestly(phone: ModuleType, cloud: CloudPhoneService, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PHONE_MODEL_URL")  # and no platform socket: no model at all
    raw = call(phone, "start_task", {"goal": NOTE_GOAL, "kind": "errand", "wait_seconds": 30})
    assert (raw["status"], raw["error"]["code"]) == ("failed", "model_not_configured")
    assert cloud.world.events[-1] == ("release", "phone-1") and not events(cloud, "tap")


def test_a_second_task_on_a_leased_phone_is_refused(phone: ModuleType, cloud: CloudPhoneService) -> None:
    cloud.hold_taps()
    first = call(phone, "start_task", {"goal": NOTE_GOAL, "kind": "errand", "app": "notes", "wait_seconds": 0})
    assert cloud.tap_started.wait(10)
    busy = call(phone, "read_screen", {"device_id": "phone-1"})
    assert busy["error"]["code"] == "device_busy"
    cloud.let_taps_go()
    phone.TASKS[first["task_id"]].done.wait(15)


# --- the platform's executor endpoint -----------------------------------------------------------


# Transactional: the model call (async_to_sync, channels' database_sync_to_async on this thread)
# closes this thread's connection, as after any request, and every request after it asks the
# database whether its capability's call is still executing.
@pytest.mark.django_db(transaction=True)
def test_the_executor_endpoint_answers_a_pack_with_the_executor_role(brain: Any) -> None:
    """``executor_fast`` has no row here: it falls back to the brain role (the demo brain)."""
    from tests.conftest import internal_client
    from yimi_project import call_capability

    claims = {"call": "c1", "run": "", "owner": None, "pack": "phone", "tool": "phone__start_task", "category": "workspace",
              "target": {}, "apis": ["executor"]}
    client = internal_client(**{call_capability.HEADER: call_capability.mint(call_capability.PACK, claims, ttl_seconds=60)})
    body = {"messages": [{"role": "system", "content": "act"}, {"role": "user", "content": "the screen tree"}]}
    answer = client.post("/internal/executor/chat/", body, content_type="application/json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["role"] == "executor_fast" and "the screen tree" in answer.json()["text"]  # the demo brain echoes
    # a capability without the executor API is refused; so is a role that is not an executor's
    other = call_capability.mint(call_capability.PACK, {**claims, "apis": ["memory"]}, ttl_seconds=60)
    assert internal_client(**{call_capability.HEADER: other}).post("/internal/executor/chat/", body, content_type="application/json").status_code == 403
    bad = client.post("/internal/executor/chat/", {**body, "role": "brain"}, content_type="application/json")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"
    empty = client.post("/internal/executor/chat/", {"messages": []}, content_type="application/json")
    assert empty.status_code == 400


# --- the contract -----------------------------------------------------------------------------


def write_secrets(root: Path, cloud: CloudPhoneService) -> Path:
    secrets = root / "secrets"
    secrets.mkdir(parents=True, exist_ok=True)
    (secrets / "PHONE_API_URL").write_text(cloud.url, encoding="utf-8")
    (secrets / "PHONE_MODEL_URL").write_text(cloud.url + "/model", encoding="utf-8")
    return secrets


def test_the_phone_contract_passes_on_the_real_server(cloud: CloudPhoneService, tmp_path: Path) -> None:
    paths = platform_paths(tmp_path, secrets_dir=write_secrets(tmp_path, cloud))
    report = run_contract(PACK, fake=False, paths=paths)
    assert report.passed, report_text(report)
    assert len(report.cases) == 9 and not report.skipped
    assert cloud.model_calls > 0 and cloud.world.payments == []  # it really drove the phone, and never paid


def test_the_phone_contract_passes_on_the_fake() -> None:
    report = run_contract(PACK, fake=True)
    assert report.passed, report_text(report)
    assert report.skipped == ["an unreachable phone service is DISCONNECTED, never a list"]


@pytest.mark.django_db
def test_pack_contract_phone_both(cloud: CloudPhoneService, tmp_path: Path, settings: Any, capsys: Any) -> None:
    settings.SECRETS_DIR = str(write_secrets(tmp_path, cloud))
    call_command("pack_contract", "phone", "--both", "--packs-dir", str(PACK.parent))
    out = capsys.readouterr().out
    assert "2/2 contract runs passed" in out and "phone  real  pass" in out and "skip  (acts on" not in out
