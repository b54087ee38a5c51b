"""Forgetting leaves no copy (F7): a payload committed through the gateway is redacted
everywhere the platform copied it — the ledger's arguments and results, consent card
previews, sub-agent tasks — each app through its own service (``memory.copies``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from brain.services import accept_utterance
from memory import copies
from memory.assertions import store as assertions
from memory.assertions.store import CommitRequest
from memory.copies import REDACTED, ForgottenContent
from memory.models import Assertion, AssertionVersion, MemoryReceipt
from tests.conftest import new_client_id
from yimi_project.errors import YimiError

PAYLOAD = "zebra-violet-7731 不吃香菜也不吃葱"
MARK = "zebra-violet-7731"  # the ASCII part: found even where JSON text escapes the rest


# --- what counts as a copy ------------------------------------------------------------------------


def test_a_copy_is_the_payload_itself_its_text_inside_a_string_or_a_cut_off_tail() -> None:
    content = ForgottenContent([{"text": PAYLOAD, "doc": "memory"}])
    assert content.redact({"payload": {"doc": "memory", "text": PAYLOAD}, "predicate": "x"}) == {"payload": REDACTED, "predicate": "x"}
    assert content.redact_text(f"记住：{PAYLOAD}。") == f"记住：{REDACTED}。"
    preview = json.dumps({"payload": {"text": PAYLOAD}}, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    cut = preview[:40]  # a preview cut at its length limit, in the middle of the text
    assert content.redact_text(cut) == cut[: cut.index(MARK)] + REDACTED
    assert content.redact_text(cut[:25]) == cut[:25]  # too little of it left to tell
    assert content.redact_text(json.dumps({"goal": PAYLOAD})) == json.dumps({"goal": REDACTED})  # \\u-escaped JSON text
    assert content.redact({PAYLOAD: 1}) == {REDACTED: 1}
    # short strings of the payload are not words to hunt for everywhere
    assert content.redact({"doc": "memory", "note": "my memory"}) == {"doc": "memory", "note": "my memory"}
    short = ForgottenContent([{"text": "香菜"}])
    assert short.redact_text("香菜") == REDACTED and short.redact_text("香菜炒牛肉") == "香菜炒牛肉"
    assert short.redact({"n": 2, "ok": True}) == {"n": 2, "ok": True}


def commit(owner: Any, payload: Any, request_id: str) -> str:
    return assertions.commit(CommitRequest(owner.pk, request_id, "preference.food", payload, 0)).assertion_id


def test_the_forget_result_counts_every_place_looked_in(owner: Any) -> None:
    aid = commit(owner, {"text": PAYLOAD}, "c-1")
    result = assertions.forget(owner.pk, aid, request_id="f-1")
    assert result.redacted == {
        "brain.agent_tasks": 0, "capabilities.receipts": 0, "capabilities.tool_calls": 0, "companion.call_snapshots": 0,
        "consent.card_previews": 0, "consent.cards_withdrawn": 0, "memory.ambient_log": 0,
    }
    assert "one-way digests" in " ".join(result.payload()["not_erased"])
    again = assertions.forget(owner.pk, aid, request_id="f-1")
    assert again.replayed and again.redacted == result.redacted
    assert assertions.forget(owner.pk, aid, request_id="f-2").redacted == {}  # nothing left to look for


def test_a_failing_redactor_rolls_the_whole_forget_back(owner: Any, monkeypatch: Any) -> None:
    aid = commit(owner, {"text": PAYLOAD}, "c-2")

    def broken(owner_id: int, content: ForgottenContent) -> dict[str, int]:
        raise RuntimeError("disk full")

    monkeypatch.setitem(copies._REDACTORS, "broken", broken)
    with pytest.raises(RuntimeError):
        assertions.forget(owner.pk, aid, request_id="f-3")
    assert Assertion.objects.get(id=aid).state == "active"
    assert AssertionVersion.objects.get(assertion_id=aid).payload == {"text": PAYLOAD}
    assert not MemoryReceipt.objects.filter(kind="forget").exists()


# --- through the gateway, checked against every table ---------------------------------------------------


def _texts_of(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (bytes, memoryview)):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, (dict, list)):
        return [json.dumps(value, ensure_ascii=False)]
    text = str(value)
    try:
        return [text, json.dumps(json.loads(text), ensure_ascii=False)]  # JSON kept as \\u-escaped text
    except (ValueError, TypeError):
        return [text]


def places_holding(*needles: str) -> list[str]:
    """Every column of every table in the database that holds one of ``needles``."""
    from django.db import connection

    found = set()
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            columns = [c.name for c in connection.introspection.get_table_description(cursor, table)]
            cursor.execute(f"SELECT {', '.join(quote(c) for c in columns)} FROM {quote(table)}")
            for row in cursor.fetchall():
                for column, value in zip(columns, row):
                    if any(n in text for text in _texts_of(value) for n in needles):
                        found.add(f"{table}.{column}")
    return sorted(found)


@pytest.fixture
def platform(request: Any, settings: Any) -> Any:
    """The platform the memory pack reaches: the internal listener where this checkout has
    one, else a live server on its loopback URL."""
    try:
        return request.getfixturevalue("internal_listener")
    except pytest.FixtureLookupError:
        server = request.getfixturevalue("live_server")
        settings.YIMI_PLATFORM_URL = server.url
        return server


@pytest.mark.django_db(transaction=True)
def test_forgetting_through_the_gateway_leaves_no_copy_anywhere_in_the_database(platform: Any, make_device: Any) -> None:
    """Committed through the gateway, the payload is in the ledger (the call's arguments,
    the results of reads), a consent card's preview and a sub-agent's goal; once forgotten,
    no column of any table holds it, and the forget result counts what was redacted. (The
    owner's utterance is L4, which forgetting keeps; here it does not quote the payload.)"""
    from brain import agents
    from capabilities.client import call_tool
    from capabilities.mcp_host import runtime
    from consent.models import ConsentCard

    runtime.reset_for_tests()
    try:
        run_id = str(accept_utterance(make_device().device, new_client_id(), "帮我记一件事").run_id)

        def tool(name: str, **args: Any) -> Any:
            return asyncio.run(call_tool(run_id, "", name, args))

        commit = tool("memory__commit", predicate="preference.food", payload={"text": PAYLOAD}, expected_version=0, owner_requested=True)
        assert commit.executed and commit.receipt["status"] == "succeeded", commit.model_text
        aid = str(Assertion.objects.get(predicate="preference.food").id)
        assert tool("memory__query", predicate="preference.food").receipt["status"] == "succeeded"
        assert tool("memory__history", assertion_id=aid).receipt["status"] == "succeeded"
        asked = tool("memory__commit", assertion_id=aid, predicate="preference.food", payload={"text": f"{PAYLOAD}，真的"}, expected_version=1)
        assert asked.decision == "ask" and PAYLOAD in ConsentCard.objects.get(call_id=asked.call_id).preview
        agents.delegate(run_id, f"记住主人说的：{PAYLOAD}")
        assert {
            "capabilities_toolcall.arguments", "capabilities_receiptrecord.receipt", "consent_consentcard.preview",
            "brain_agenttask.goal", "memory_assertionversion.payload",
        } <= set(places_holding(MARK))

        forget = tool("memory__forget", assertion_id=aid, owner_requested=True)
        assert forget.executed and forget.receipt["status"] == "succeeded", forget.model_text

        assert places_holding(PAYLOAD, MARK) == []
        assert MemoryReceipt.objects.get(kind="forget").result["redacted"] == {
            "brain.agent_tasks": 1, "capabilities.receipts": 2, "capabilities.tool_calls": 2, "companion.call_snapshots": 0,
            "consent.card_previews": 1, "consent.cards_withdrawn": 1, "memory.ambient_log": 0,
        }
        assert "Copies redacted: brain.agent_tasks 1, capabilities.receipts 2" in forget.receipt["content"]["text"]
        # the card that would have run the forgotten payload is withdrawn, never executed
        card = ConsentCard.objects.get(call_id=asked.call_id)
        assert card.state == "expired" and REDACTED in card.preview
        with pytest.raises(YimiError):
            assertions.commit(CommitRequest(card.owner_id, "c-9", "preference.food", {"text": "again"}, 1, Assertion.objects.get(id=aid).id))
    finally:
        runtime.reset_for_tests()
