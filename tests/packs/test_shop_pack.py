"""The ``shop`` pack (奶茶小铺): manifest, contract against the real server and the fake,
the store file shared by host processes, and the CheckoutStop that changes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from capabilities.contract import receipt_problems, run_contract
from capabilities.manifest import load_pack, load_packs, manifest_errors
from capabilities.mcp_host.host import load_tools_module
from tests.conftest import platform_paths

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKS = REPO_ROOT / "packs"
PACK = PACKS / "shop"
DRIFT_CASE = "a price that changes at the checkout is AMOUNT_CHANGED and never paid"
STOP_CASE = "checkout without a payment intent stops before the checkout and changes nothing"


def report_text(report: Any) -> str:
    lines = [f"{report.pack} ({report.implementation}): errors={report.errors}"]
    for case in report.cases:
        lines.append(f"  {'pass' if case.passed else 'FAIL'} {case.name}")
        lines.extend(f"      {f}" for f in case.failures)
    return "\n".join(lines)


def shop_tools(fake: bool = False) -> Any:
    return load_tools_module(load_pack(PACK), fake).tools


def call(tools: Any, name: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    """Call a tool in-process and check the result is a clean receipt."""
    args = args or {}
    raw = tools[name].handler(dict(args))
    problems = receipt_problems(raw, load_pack(PACK).tools[name], args)
    assert not problems, (name, problems, raw)
    return raw


def values_of(raw: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {v["name"]: (v["value"], v["unit"]) for v in raw.get("values", [])}


def read_store(data_dir: Path) -> dict[str, Any]:
    return json.loads((data_dir / "shop" / "store.json").read_text(encoding="utf-8"))


# --- the manifest ---------------------------------------------------------------------------


def test_the_shop_manifest_loads_and_declares_its_effects() -> None:
    pack = load_pack(PACK)
    # it keeps its store in a directory of its own, so it runs in a host of its own
    assert (pack.name, pack.scopes, pack.host, pack.maintainer, pack.filesystem) == ("shop", ["owner"], "dedicated", "lead", ["own"])
    tools = pack.tools
    assert {name: t.resolve_category({}) for name, t in tools.items()} == {
        "browse": "observe", "add_to_cart": "workspace", "checkout": "workspace", "pay": "spend", "order_status": "observe",
    }
    pay = tools["pay"]
    assert (pay.task_type, pay.retry, pay.check_with, pay.target_of({"payment_intent_id": "x"})) == ("payment", "forbidden", "order_status", None)
    for fake in (False, True):
        assert set(shop_tools(fake)) == set(tools)
    assert json.loads((PACK / "mcp.json").read_text(encoding="utf-8"))["mcpServers"]["shop"]["args"][-2:] == ["--select", "shop"]


def test_only_the_shop_declares_spend_and_only_as_a_lead_pack() -> None:
    packs = load_packs(PACKS)
    assert "shop" in packs.packs, packs.refused
    spending = {p.name for p in packs.packs.values() for t in p.tools.values() if "spend" in (t.spec.get("effect"), *t.spec.get("effect_by_arg", {}).get("map", {}).values())}
    assert spending == {"shop"}
    data = json.loads((PACK / "plugin.json").read_text(encoding="utf-8"))
    data["extensions"]["ai.yimi.capability"]["maintainer"] = "yimi"
    assert any("may not declare spend" in e for e in manifest_errors(data))


# --- the contract ---------------------------------------------------------------------------


def test_the_shop_contract_passes_on_the_real_server(tmp_path: Path) -> None:
    report = run_contract(PACK, fake=False, paths=platform_paths(tmp_path, data_dir=tmp_path))
    assert report.passed, report_text(report)
    assert len(report.cases) == 6 and not report.skipped
    # the real server kept it all in the store file (its own directory): three orders, every authorization used once
    store = read_store(tmp_path / "packs")
    assert [(o["amount"], o["state"]) for o in store["orders"]] == [("38.00", "paid"), ("58.00", "paid"), ("12.50", "paid")]
    assert [a.rsplit("-", 1)[1] for a in store["used_authorizations"]] == ["d1", "d2", "a1", "b1"]
    assert store["cart"] == [] and store["price_drift"] == [] and store["checkout"]["state"] == "paid"
    assert store["merchant"] == {"name": "奶茶小铺", "payee": "milk-tea-shop"}


def test_the_shop_contract_passes_on_the_fake() -> None:
    report = run_contract(PACK, fake=True)
    assert report.passed, report_text(report)
    assert len(report.cases) == 6 and not report.skipped


@pytest.mark.parametrize(
    "old,new,case,needle",
    [
        ("            if amount != authorized:\n", "            if False:\n", DRIFT_CASE, "AMOUNT_CHANGED"),
        ("            if not intent:\n                view =", "            if False:\n                view =", STOP_CASE, "checkout_stop"),
        ("            if authorization in store[\"used_authorizations\"]:\n", "            if False:\n", DRIFT_CASE, "authorization_reused"),
    ],
    ids=["pays-a-changed-amount", "no-checkout-stop", "reuses-authorizations"],
)
def test_the_contract_catches_an_unsafe_shop(tmp_path: Path, old: str, new: str, case: str, needle: str) -> None:
    copy_dir = Path(shutil.copytree(PACK, tmp_path / "shop", ignore=shutil.ignore_patterns("__pycache__")))
    server = copy_dir / "server" / "tools.py"
    source = server.read_text(encoding="utf-8")
    assert source.count(old) == 1
    server.write_text(source.replace(old, new), encoding="utf-8")
    report = run_contract(copy_dir, fake=True)  # the fake runs the copy's server handlers
    assert not report.passed
    failed = {c.name: c.failures for c in report.cases if not c.passed}
    assert case in failed, report_text(report)
    assert any(needle in f for f in failed[case]), report_text(report)


# --- the real store, shared by host processes -----------------------------------------------


def host_env(data_dir: Path, **extra: str) -> dict[str, str]:
    return {"PYTHONPATH": str(REPO_ROOT), "PYTHONDONTWRITEBYTECODE": "1", "YIMI_PACKS_DATA_DIR": str(data_dir), **extra}


@contextlib.asynccontextmanager
async def shop_host(env: dict[str, str], errlog: Path) -> AsyncIterator[ClientSession]:
    """One real shop host process and its client session."""
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "capabilities.mcp_host.host", "--packs-dir", str(PACKS), "--select", "shop"],
        env=env, cwd=str(REPO_ROOT),
    )
    with open(errlog, "a", encoding="utf-8") as err:
        async with stdio_client(params, errlog=err) as (read, write), ClientSession(read, write) as session:
            await asyncio.wait_for(session.initialize(), 60)
            yield session


async def calls_in(session: ClientSession, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    results = []
    for tool, args in calls:
        result = await asyncio.wait_for(session.call_tool(f"shop__{tool}", args), 30)
        assert not result.is_error, (tool, result.content)
        results.append(result.structured_content)
    return results


async def in_host(env: dict[str, str], calls: list[tuple[str, dict[str, Any]]], errlog: Path) -> list[dict[str, Any]]:
    """Start one real shop host process, make the calls in order, stop it."""
    async with shop_host(env, errlog) as session:
        return await calls_in(session, calls)


def test_an_order_persists_across_two_host_processes(tmp_path: Path) -> None:
    data, log = tmp_path / "data", tmp_path / "host.log"
    first = asyncio.run(in_host(host_env(data), [
        ("add_to_cart", {"item": "芝士葡萄", "quantity": 2}),
        ("checkout", {"payment_intent_id": "pi-1"}),
        ("pay", {"payment_intent_id": "pi-1", "payment_authorization_id": "pa-1", "authorized_amount": "50.00"}),
    ], log))
    assert first[1]["content"]["amount"] == "50.00" and values_of(first[1])["amount"] == (50.0, "yuan")
    paid = first[2]
    assert paid["status"] == "succeeded", paid
    order_id = paid["content"]["order_id"]
    assert paid["effects"] == [{"target": order_id, "action": "pay", "verification": "verified"}] and order_id in paid["summary"]
    assert [o["order_id"] for o in read_store(data)["orders"]] == [order_id]

    # a second process, on the same store; the drift variable only counts when the store is created
    second = asyncio.run(in_host(host_env(data, YIMI_SHOP_PRICE_DRIFT="5.00"), [
        ("order_status", {}),
        ("pay", {"payment_intent_id": "pi-1", "payment_authorization_id": "pa-1", "authorized_amount": "50.00"}),
        ("add_to_cart", {"item": "珍珠奶茶", "quantity": 1}),
        ("checkout", {"payment_intent_id": "pi-2"}),
        ("pay", {"payment_intent_id": "pi-2", "payment_authorization_id": "pa-2", "authorized_amount": "18.00"}),
    ], log))
    status, reused, _, _, again = second
    assert status["status"] == "succeeded" and status["content"]["items"][0]["order_id"] == order_id
    assert (status["content"]["order_id"], status["content"]["amount"], status["content"]["state"]) == (order_id, "50.00", "paid")
    assert (reused["status"], reused["error"]["code"]) == ("failed", "authorization_reused")
    assert again["status"] == "succeeded" and values_of(again)["amount_paid"] == (18.0, "yuan")
    store = read_store(data)
    assert [o["amount"] for o in store["orders"]] == ["50.00", "18.00"] and store["price_drift"] == []


def test_two_host_processes_share_the_store_under_the_lock(tmp_path: Path) -> None:
    data, rounds = tmp_path / "data", 40
    adds = [("add_to_cart", {"item": "柠檬绿茶", "quantity": 1})] * rounds

    async def both() -> list[list[dict[str, Any]]]:
        async with shop_host(host_env(data), tmp_path / "a.log") as a, shop_host(host_env(data), tmp_path / "b.log") as b:
            return await asyncio.gather(calls_in(a, adds), calls_in(b, adds))  # both running, adding at once

    results = asyncio.run(both())
    assert all(r["status"] == "succeeded" for rs in results for r in rs)
    assert read_store(data)["cart"] == [{"item": "柠檬绿茶", "quantity": 2 * rounds}]  # no add was lost
    assert not list((data / "shop").glob(".store-*"))  # no temporary file left behind


def test_the_store_is_created_with_defaults_next_to_the_workspace(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.delenv("YIMI_PACKS_DATA_DIR", raising=False)
    monkeypatch.setenv("YIMI_WORKSPACE_DIR", str(tmp_path / "workspace"))
    monkeypatch.setenv("YIMI_SHOP_PRICE_DRIFT", "2.00, nonsense, -1.5")
    browsed = call(shop_tools(), "browse")
    store = read_store(tmp_path / "packs")
    assert (store["merchant"], store["eta"], store["price_drift"]) == ({"name": "奶茶小铺", "payee": "milk-tea-shop"}, "25 分钟", ["2.00", "-1.50"])
    assert store["menu"]["珍珠奶茶"] == "18.00" and len(store["menu"]) >= 3
    assert (store["cart"], store["orders"], store["used_authorizations"], store["checkout"]["state"]) == ([], [], [], "cart")
    assert {"item": "珍珠奶茶", "price": "18.00"} in browsed["content"]["items"]
    assert (browsed["content"]["merchant"], browsed["content"]["payee"], browsed["content"]["eta"]) == ("奶茶小铺", "milk-tea-shop", "25 分钟")


# --- CheckoutStop ---------------------------------------------------------------------------


def check_stop(stopped: dict[str, Any]) -> None:
    assert (stopped["status"], stopped["error"]["code"]) == ("failed", "checkout_stop")
    assert stopped["summary"].startswith("stopped before the checkout: there is no payment intent")
    assert "effects" not in stopped
    assert values_of(stopped) == {"amount": (36.0, "yuan"), "item_count": (2, "item")}
    content = stopped["content"]
    assert (content["merchant"], content["payee"], content["amount"], content["eta"]) == ("奶茶小铺", "milk-tea-shop", "36.00", "25 分钟")
    assert content["items"] == [{"item": "珍珠奶茶", "quantity": 2, "unit_price": "18.00", "line_total": "36.00"}]


def test_checkout_stop_leaves_the_store_file_unchanged(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("YIMI_PACKS_DATA_DIR", str(tmp_path))
    tools = shop_tools()
    assert call(tools, "add_to_cart", {"item": "珍珠奶茶", "quantity": 2})["status"] == "succeeded"
    path = tmp_path / "shop" / "store.json"
    before, stat = path.read_bytes(), path.stat()
    for args in ({}, {"payment_intent_id": ""}, {"payment_intent_id": None, "owner_requested": True}):
        check_stop(call(tools, "checkout", args))
    after = path.stat()
    assert path.read_bytes() == before and (after.st_ino, after.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)  # not even rewritten
    assert read_store(tmp_path)["checkout"]["state"] == "cart"
    refused = call(tools, "pay", {"payment_intent_id": "pi-x", "payment_authorization_id": "pa-x", "authorized_amount": "36.00"})
    assert refused["error"]["code"] == "not_at_checkout" and read_store(tmp_path)["orders"] == []
    # with an intent the page opens: the same store now changes
    opened = call(tools, "checkout", {"payment_intent_id": "pi-x"})
    assert opened["status"] == "succeeded" and opened["content"]["amount"] == "36.00" and path.read_bytes() != before
    assert read_store(tmp_path)["checkout"] == {"state": "checkout", "payment_intent_id": "pi-x", "amount": "36.00", "adjustment": "0.00"}


def test_checkout_stop_leaves_the_fake_store_unchanged() -> None:
    tools = shop_tools(fake=True)
    state = tools["checkout"].handler.__globals__["STORE"].state  # the fake's module-level dict
    assert call(tools, "add_to_cart", {"item": "珍珠奶茶", "quantity": 2})["status"] == "succeeded"
    before = copy.deepcopy(state)
    for args in ({}, {"payment_intent_id": ""}):
        check_stop(call(tools, "checkout", args))
    assert state == before and state["checkout"]["state"] == "cart"
    assert call(tools, "checkout", {"payment_intent_id": "pi-y"})["status"] == "succeeded"
    assert state["checkout"]["state"] == "checkout" and state != before
