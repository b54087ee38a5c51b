"""The built-in ``memory`` capability pack: manifest, contract (real server against the
platform, and the fake), and how the gateway classifies its calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from brain.services import accept_utterance
from capabilities.contract import run_contract
from capabilities.manifest import load_pack
from capabilities.services import CallRequest, decide
from memory.models import Assertion, AssertionVersion
from tests.conftest import new_client_id

PACK = Path(__file__).resolve().parents[2] / "packs" / "memory"


def report_text(report: Any) -> str:
    lines = [f"{report.pack} ({report.implementation}): errors={report.errors}"]
    for case in report.cases:
        lines.append(f"  {'pass' if case.passed else 'FAIL'} {case.name}")
        lines.extend(f"      {f}" for f in case.failures)
    return "\n".join(lines)


def test_the_memory_manifest_declares_commit_owner_data_forget_delete_and_reads_observe() -> None:
    pack = load_pack(PACK)
    tools = pack.tools
    # it reaches the platform's memory API with per-call capabilities, and nothing else
    assert pack.scopes == ["owner"] and pack.egress == [] and pack.secrets == [] and pack.platform_api == ["memory"]
    assert pack.host == "dedicated"
    assert tools["commit"].resolve_category({}) == "owner_data"
    assert tools["forget"].resolve_category({}) == "delete"
    assert tools["query"].resolve_category({}) == "observe" and tools["history"].resolve_category({}) == "observe"
    assert tools["recall"].resolve_category({}) == "observe" and tools["search_history"].resolve_category({}) == "observe"
    prefs = tools["speaking_preferences"]
    assert [prefs.resolve_category({"action": a}) for a in ("show", "set", "restore", "dance")] == ["observe", "owner_data", "owner_data", None]
    for name in ("commit", "forget", "speaking_preferences"):
        assert tools[name].context_inject == ["idempotency_key"] and tools[name].retry == "after_check"


def test_the_memory_contract_passes_on_the_fake() -> None:
    report = run_contract(PACK, fake=True)
    assert report.passed, report_text(report)
    assert report.skipped == ["an unreachable platform is DISCONNECTED, never a success"]


@pytest.mark.django_db(transaction=True)
def test_the_memory_contract_passes_on_the_real_server_against_the_platform(internal_listener: Any, settings: Any, owner: Any, tmp_path: Path) -> None:
    settings.DATA_DIR = tmp_path
    report = run_contract(PACK, fake=False, owner_id=owner.pk)
    assert report.passed, report_text(report)
    assert len(report.cases) == 7 and not report.skipped
    # the platform really stored them, as the agent, and the contract forgot every one
    assert Assertion.objects.filter(owner=owner, predicate="contract.test").count() == 5
    assert not Assertion.objects.filter(predicate="contract.test", state="active").exists()
    assert not AssertionVersion.objects.filter(assertion__predicate="contract.test", erased=False).exists()
    assert set(AssertionVersion.objects.values_list("actor", flat=True)) == {"agent"}


def test_the_gateway_classifies_memory_calls(make_device: Any) -> None:
    """Memory writes are owner_data, forgetting is delete (both gated by consent: allowed
    when the owner asked, a card otherwise), reads observe (allowed)."""
    from consent.models import ConsentCard

    run_id = str(accept_utterance(make_device().device, new_client_id(), "记住我不吃香菜").run_id)
    commit = {"predicate": "preference.food", "payload": {"text": "不吃香菜"}, "expected_version": 0}
    forget = {"assertion_id": "00000000-0000-4000-8000-000000000000"}

    def decided(tool: str, arguments: dict[str, Any]) -> tuple[str, str, str]:
        decision = decide(CallRequest(run_id, tool, arguments))
        return decision.decision, decision.code, decision.category

    assert decided("memory__query", {"predicate": "preference.food"}) == ("allow", "ok", "observe")
    assert decided("memory__recall", {"question": "上周我说过什么"}) == ("allow", "ok", "observe")
    assert decided("memory__search_history", {"query": "香菜"}) == ("allow", "ok", "observe")
    # the capability the pack gets names the call's run: history lookups are counted per run
    from yimi_project import call_capability

    claims = call_capability.verify(call_capability.PACK, decide(CallRequest(run_id, "memory__search_history", {"query": "菜单"})).pack_capability)
    assert claims is not None and claims["run"] == run_id and claims["tool"] == "memory__search_history"
    # allowed, as "rewrite": the gateway injects the idempotency_key both tools ask for
    assert decided("memory__commit", {**commit, "owner_requested": True}) == ("rewrite", "owner_requested", "owner_data")
    assert decided("memory__forget", {**forget, "owner_requested": True}) == ("rewrite", "owner_requested", "delete")
    assert decided("memory__commit", commit) == ("ask", "waiting_for_owner", "owner_data")
    assert decided("memory__forget", forget) == ("ask", "waiting_for_owner", "delete")
    assert sorted(ConsentCard.objects.values_list("category", flat=True)) == ["delete", "owner_data"]


@pytest.mark.django_db(transaction=True)
def test_memory_tools_run_through_the_gateway_with_consent(internal_listener: Any, settings: Any, make_device: Any, tmp_path: Path) -> None:
    """An owner-requested commit runs over MCP against the live platform and is receipted;
    an unrequested forget waits for the owner's card and changes nothing."""
    import asyncio

    from capabilities.client import call_tool
    from capabilities.mcp_host import runtime
    from consent.models import ConsentCard
    from memory.models import Assertion

    runtime.reset_for_tests()
    try:
        run_id = str(accept_utterance(make_device().device, new_client_id(), "记住我不吃香菜").run_id)
        commit = asyncio.run(call_tool(run_id, "", "memory__commit", {
            "predicate": "preference.food", "payload": {"text": "不吃香菜"}, "expected_version": 0, "owner_requested": True,
        }))
        assert commit.executed and commit.receipt is not None and commit.receipt["status"] == "succeeded", commit.model_text
        stored = Assertion.objects.get(predicate="preference.food")
        forget = asyncio.run(call_tool(run_id, "", "memory__forget", {"assertion_id": str(stored.id)}))
        assert (forget.decision, forget.executed) == ("ask", False)
        assert ConsentCard.objects.get(call_id=forget.call_id).category == "delete"
        assert Assertion.objects.get(id=stored.id).state == "active"
    finally:
        runtime.reset_for_tests()


@pytest.mark.django_db(transaction=True)
def test_history_search_through_the_gateway_allows_three_lookups_a_run(internal_listener: Any, settings: Any, make_device: Any, tmp_path: Path) -> None:
    """The gateway's capability carries the run, so the platform refuses the 4th lookup
    of one run with history_lookup_limit; a new run may look again."""
    import asyncio

    from capabilities.client import call_tool
    from capabilities.mcp_host import runtime
    from memory.timeline.entries import append_entry

    runtime.reset_for_tests()
    try:
        device = make_device().device
        append_entry(owner_id=device.owner_id, kind="utterance", text="上周说过不吃香菜", scope="owner")
        run_id = str(accept_utterance(device, new_client_id(), "上周我说过什么").run_id)
        outcomes = [asyncio.run(call_tool(run_id, "", "memory__search_history", {"query": q})) for q in ("香菜", "上周", "不吃", "说过")]
        assert [o.receipt["status"] for o in outcomes if o.receipt] == ["succeeded", "succeeded", "succeeded", "failed"], [o.model_text for o in outcomes]
        assert outcomes[0].receipt is not None and outcomes[0].receipt["content"]["items"][0]["text"] == "上周说过不吃香菜"
        assert outcomes[3].receipt is not None and outcomes[3].receipt["error"]["code"] == "history_lookup_limit"
        recalled = asyncio.run(call_tool(run_id, "", "memory__recall", {"question": "上周我说过香菜吗"}))
        assert recalled.receipt is not None and recalled.receipt["status"] == "succeeded"
        assert "上周说过不吃香菜" in [e["text"] for e in recalled.receipt["content"]["timeline"]]
        next_run = str(accept_utterance(device, new_client_id(), "再查一次").run_id)
        again = asyncio.run(call_tool(next_run, "", "memory__search_history", {"query": "香菜"}))
        assert again.receipt is not None and again.receipt["status"] == "succeeded"
    finally:
        runtime.reset_for_tests()
