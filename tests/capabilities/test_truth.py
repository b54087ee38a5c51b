"""Facts are said by the system: templates, fact ids, the diff, and the reply checker.

Pure functions: no database, no model, no network.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from capabilities.truth import (
    FACT_KINDS,
    STATUSES,
    TEMPLATES,
    Fact,
    ReplyCheck,
    activity_card,
    check_reply,
    chinese_to_arabic,
    claims,
    numerals,
    render_diff,
    render_facts,
    split_sentences,
    units_compatible,
)


def receipt(status: str = "succeeded", **kw: Any) -> dict[str, Any]:
    return {"receipt_schema": 1, "status": status, **kw}


def write_receipt(n: int = 12, *, verification: str = "verified", category: str = "workspace") -> dict[str, Any]:
    return receipt(
        "succeeded",
        effects=[{"target": "notes.md", "action": "write", "category": category, "verification": verification}],
        values=[{"name": "写入大小", "value": n, "unit": "byte", "source": "workspace file system"}],
    )


def check(text: str, receipts: list[dict[str, Any]], delivered: set[str] | None = None,
          facts: list[Fact] | None = None, **kw: Any):
    if facts is None:
        facts = [f for i, r in enumerate(receipts) for f in render_facts(r, tool_label="写文件", key=f"call-{i}")]
    return check_reply(text, receipts=receipts, delivered_fact_ids=delivered or set(), facts=facts, **kw)


def reasons(result) -> list[str]:
    return [reason for _, reason in result.removed]


# --- facts and templates -----------------------------------------------------------------


def test_fact_id_is_sha256_of_key_kind_and_canonical_content() -> None:
    fact = render_facts(receipt("succeeded"), tool_label="写文件", key="task-1:call-1")[0]
    content = json.dumps({"template": "status.succeeded", "status": "succeeded"}, sort_keys=True,
                         ensure_ascii=False, separators=(",", ":"))
    expected = hashlib.sha256(f"task-1:call-1\x1fstatus\x1f{content}".encode()).hexdigest()[:16]
    assert fact.id == expected
    assert len(fact.id) == 16 and int(fact.id, 16) >= 0


def test_fact_ids_are_stable_and_distinct_per_call() -> None:
    r = write_receipt()
    first = render_facts(r, tool_label="写文件", key="call-1")
    again = render_facts(json.loads(json.dumps(r)), tool_label="写文件", key="call-1")
    other_call = render_facts(r, tool_label="写文件", key="call-2")
    assert [f.id for f in first] == [f.id for f in again]
    assert not {f.id for f in first} & {f.id for f in other_call}
    assert len({f.id for f in first}) == len(first)
    # the label is presentation, not content: renaming a tool keeps the ids
    assert [f.id for f in render_facts(r, tool_label="Write file", key="call-1")] == [f.id for f in first]
    # a changed value is a new fact
    changed = render_facts(write_receipt(13), tool_label="写文件", key="call-1")
    assert {f.id for f in changed if f.kind == "values"}.isdisjoint({f.id for f in first if f.kind == "values"})


@pytest.mark.parametrize(
    ("status", "text", "voice"),
    [
        ("succeeded", "「写文件」已完成。", "办好了。"),
        ("failed", "「写文件」没有成功。", "没办成。"),
        ("unknown", "「写文件」结果还不清楚。", "结果还不清楚。"),
        ("waiting", "「写文件」在等你确认，本次未执行。", "在等你确认。"),
        ("running", "「写文件」还在办。", "还在办。"),
        ("queued", "「写文件」排上队了，还在办。", "还在办。"),
        ("cancelled", "「写文件」已取消，没有执行。", "已取消。"),
        ("partial", "「写文件」只完成了一部分。", "只办好了一部分。"),
        ("rejected", "「写文件」被拦下了，没有执行。", "没有执行。"),
    ],
)
def test_every_status_has_a_fixed_text_and_a_shorter_voice(status: str, text: str, voice: str) -> None:
    fact = render_facts(receipt(status), tool_label="写文件", key="k")[0]
    assert (fact.kind, fact.status, fact.text, fact.voice) == ("status", status, text, voice)
    assert len(fact.voice) < len(fact.text)


def test_all_nine_statuses_have_templates() -> None:
    assert {f"status.{s}" for s in STATUSES} <= set(TEMPLATES)
    assert len(STATUSES) == 9


def test_templates_are_per_kind_not_per_tool() -> None:
    # one small table, keyed by fact kind, no tool names in it
    assert all(key.split(".")[0] in FACT_KINDS for key in TEMPLATES)
    assert len(TEMPLATES) <= 30
    r = receipt(
        "succeeded",
        effects=[{"target": "a.md", "action": "write", "verification": "verified"}],
        values=[{"name": "大小", "value": 3, "unit": "byte", "source": "fs"}],
        unknowns=["对方是否已读"],
        next={"retry": "forbidden"},
    )
    a = render_facts(r, tool_label="写文件", key="k")
    b = render_facts(r, tool_label="发消息", key="k")
    assert [f.template for f in a] == [f.template for f in b]
    assert [f.text.replace("写文件", "TOOL") for f in a] == [f.text.replace("发消息", "TOOL") for f in b]
    for fact in a:
        assert fact.template in TEMPLATES
        assert fact.kind == fact.template.split(".")[0]


def test_values_are_rendered_as_name_value_unit() -> None:
    facts = render_facts(write_receipt(12), tool_label="写文件", key="k")
    (value,) = [f for f in facts if f.kind == "values"]
    assert value.text == "写入大小：12 byte。"
    assert (value.number, value.unit) == (12.0, "byte")
    floats = render_facts(receipt(values=[{"name": "温度", "value": 21.50, "unit": "°C", "source": "s"}]),
                          tool_label="t", key="k")
    assert floats[1].text == "温度：21.5 °C。"


def test_a_number_without_a_unit_is_not_stated() -> None:
    facts = render_facts(receipt(values=[{"name": "count", "value": 7, "unit": None, "source": "s"},
                                         {"name": "replayed", "value": False, "source": "s"}]),
                         tool_label="t", key="k")
    assert [f.text for f in facts if f.kind == "values"] == ["replayed：否。"]


def test_effects_are_worded_by_verification() -> None:
    r = receipt(
        "partial",
        effects=[
            {"target": "a.md", "action": "write", "verification": "verified"},
            {"target": "mac:command", "action": "run", "verification": "service_ack"},
            {"target": "b.md", "action": "write", "verification": "not_verified"},
            {"target": "c.md", "action": "delete", "verification": "unknown"},
        ],
    )
    texts = [f.text for f in render_facts(r, tool_label="t", key="k") if f.kind == "effects"]
    assert texts == [
        "已写入 a.md，已核实。",
        "已运行 mac:command，服务已确认接受。",
        "写入 b.md 还没有核实。",
        "不清楚 c.md 是否已删除。",
    ]


def test_a_service_ack_claims_only_what_the_service_said_by_category() -> None:
    """A server's acceptance of a send is not the recipient's; a memory write is saved,
    nobody "received" it. The wording follows the category the gateway stamped."""
    def effect_text(category: str | None, action: str, target: str) -> str:
        eff = {"target": target, "action": action, "verification": "service_ack", **({"category": category} if category else {})}
        (fact,) = [f for f in render_facts(receipt("succeeded", effects=[eff]), tool_label="t", key="k") if f.kind == "effects"]
        return fact.text

    sent = effect_text("send", "send", "张三")
    assert sent == "张三：已交给服务器，是否送达还不知道。"
    saved = effect_text("owner_data", "commit", "assertion:7")
    assert saved == "已记下 assertion:7，已保存。"
    for text in (sent, saved, effect_text(None, "run", "mac:command"), effect_text("physical", "open", "door")):
        assert not any(word in text for word in ("收到", "确认收到", "已读", "received")), text
    # verified stays verified whatever the category
    (verified,) = [f for f in render_facts(receipt("succeeded", effects=[
        {"target": "张三", "action": "send", "category": "send", "verification": "verified"}]), tool_label="t", key="k") if f.kind == "effects"]
    assert verified.text == "已发送 张三，已核实。"


def test_unknowns_and_next_permission_are_facts() -> None:
    """The retry permission is a fact in two wordings: the model reads what to do next, the
    owner reads what happens (or nothing, when it tells a person nothing new)."""
    facts = render_facts(receipt("succeeded", unknowns=["对方是否已读"], next={"retry": "forbidden"}),
                         tool_label="发消息", key="k")
    assert "还不清楚：对方是否已读。" in [f.text for f in facts]
    (done,) = [f for f in facts if f.kind == "next"]
    assert done.model_text == "这项操作已经成功，不要重复。"
    assert (done.text, done.voice, done.for_owner) == ("", "", False)
    check_first = render_facts(receipt("unknown", next={"retry": "after_check", "check_with": "查消息"}),
                               tool_label="发消息", key="k")
    assert check_first[-1].kind == "next"
    assert check_first[-1].model_text == "重试前要先用「查消息」核查。"
    assert check_first[-1].text == "核查结果之前不会再试。"
    assert check_first[0].model_text == "「发消息」结果还不清楚，要先核查。"
    assert check_first[0].text == "「发消息」结果还不清楚。"


def test_render_diff_returns_only_undelivered_facts() -> None:
    facts = render_facts(write_receipt(), tool_label="写文件", key="k")
    delivered = {facts[0].id, facts[1].id}
    diff = render_diff(facts + facts, delivered)
    assert [f.id for f in diff] == [f.id for f in facts[2:]]
    assert render_diff(facts, {f.id for f in facts}) == []
    assert render_diff(facts, set()) == facts


def test_activity_card_status_comes_straight_from_the_receipt() -> None:
    for status in ("unknown", "waiting", "succeeded", "failed"):
        card = activity_card("task-9", "写文件", receipt(status))
        assert card["status"] == status
        assert card["task_id"] == "task-9" and card["title"] == "写文件"
    card = activity_card("task-9", "写文件", receipt("unknown", unknowns=["文件是否写入"]))
    assert card["facts"] == ["「写文件」结果还不清楚。", "还不清楚：文件是否写入。"]


def test_activity_card_redacts_internal_markers_in_its_title_and_facts() -> None:
    call_id = "3f2b9c1e-8d4a-4b6f-9e2d-1a7c5b3e9f01"
    card = activity_card("task-9", "notes__write for run " + call_id,
                         receipt("unknown", unknowns=[f"did call {call_id} write /x"]))
    shown = " ".join([card["title"], *card["facts"]])
    assert call_id not in shown and "notes__write" not in shown
    assert "[redacted]" in card["title"] and any("[redacted]" in fact for fact in card["facts"])
    assert card["task_id"] == "task-9"  # the card's own key for the device, not text


# --- two audiences: the model's instructions never reach the owner ----------------------

# What makes a sentence an instruction to the model: telling it what (not) to do next, or
# naming the read tool it must run first (a tool name means nothing to a person).
INSTRUCTION_MARKERS = ("不要", "要先", "重试前", "不能重试", "先用", "do not", "don't", "before retrying")
CHECK_WITH = "查消息"


def every_receipt() -> list[dict[str, Any]]:
    """Receipts that reach every template: each status with each retry permission (with
    and without check_with) and waiting_on, each verification of an effect in each
    category, values and unknowns."""
    out: list[dict[str, Any]] = []
    nexts: list[dict[str, Any]] = [{}]
    for retry in ("allowed", "forbidden", "after_check"):
        nexts += [{"retry": retry}, {"retry": retry, "check_with": CHECK_WITH}]
    nexts += [{"waiting_on": "owner"}, {"waiting_on": "service"}, {"retry": "forbidden", "waiting_on": "owner"}]
    for status in STATUSES:
        for nxt in nexts:
            out.append(receipt(status, next=nxt) if nxt else receipt(status))
    for verification in ("verified", "service_ack", "not_verified", "unknown"):
        for category in (None, "observe", "workspace", "owner_data", "send", "account", "delete", "physical", "spend", "self_change"):
            eff = {"target": "alice@example.com", "action": "send", "verification": verification}
            out.append(receipt("partial", effects=[eff | ({"category": category} if category else {})]))
    out.append(receipt("succeeded", values=[{"name": "大小", "value": 3, "unit": "byte", "source": "s"},
                                            {"name": "replayed", "value": False, "source": "s"},
                                            {"name": "状态", "value": "ok", "source": "s"}],
                       unknowns=["对方是否已读"]))
    return out


def test_every_template_is_reached_by_the_audience_checks() -> None:
    """The checks below render every template the renderer has: a new one is covered too."""
    reached = {f.template for r in every_receipt() for f in render_facts(r, tool_label="发消息", key="k")}
    assert reached == set(TEMPLATES)


def test_no_owner_wording_of_any_fact_is_an_instruction_to_the_model() -> None:
    instructions = set()
    for r in every_receipt():
        for fact in render_facts(r, tool_label="发消息", key="k"):
            for shown in (fact.text, fact.voice):
                assert not any(m in shown.lower() for m in INSTRUCTION_MARKERS), (fact.template, shown)
                assert CHECK_WITH not in shown, (fact.template, shown)
            if fact.model_text != fact.text:
                instructions.add(fact.model_text)
    # the model does get its instructions, in its own wording
    assert {"这项操作已经成功，不要重复。", f"重试前要先用「{CHECK_WITH}」核查。", "重试前要先核查结果。"} <= instructions


def test_cards_and_appended_reply_facts_carry_no_model_instruction() -> None:
    for i, r in enumerate(every_receipt()):
        facts = render_facts(r, tool_label="发消息", key=f"k{i}")
        model_only = [f.model_text for f in facts if f.model_text != f.text]
        card = activity_card(f"k{i}", "发消息", r)
        for voice in (False, True):
            told = check_reply("", receipts=[r], delivered_fact_ids=set(), facts=facts, voice=voice).text
            for shown in [told, *card["facts"]]:
                assert not any(m in shown.lower() for m in INSTRUCTION_MARKERS), shown
                assert not any(instruction in shown for instruction in model_only), shown
        assert all(card["facts"]), card  # a fact only the model reads is not an empty line on a card


def test_a_reply_that_copies_a_model_instruction_loses_that_sentence() -> None:
    r = receipt("succeeded", effects=[{"target": "alice", "action": "send", "category": "send", "verification": "verified"}],
                next={"retry": "forbidden"})
    unknown = receipt("unknown", next={"retry": "after_check", "check_with": CHECK_WITH})
    result = check(f"发好了。这项操作已经成功，不要重复。重试前要先用「{CHECK_WITH}」核查。", [r, unknown])
    assert reasons(result) == ["model_instruction", "model_instruction"]
    assert result.text.startswith("发好了。")
    assert "不要重复" not in result.text and CHECK_WITH not in result.text
    assert "核查结果之前不会再试。" in result.text  # the owner's wording of the same fact


# --- Chinese numerals --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("十二", "12"),
        ("二十", "20"),
        ("一百零五", "105"),
        ("三千二百", "3200"),
        ("两万", "20000"),
        ("一点五", "1.5"),
        ("百分之二十", "20%"),
        ("3万", "30000"),
        ("1.5万", "15000"),
        ("一亿两千万", "120000000"),
        ("两万五", "25000"),
        ("二〇二四年", "2024年"),
        ("写了十二个字节", "写了12个字节"),
        ("半小时", "半小时"),
        ("两个半小时", "2个半小时"),
        ("等一下", "等一下"),
        ("万一失败", "万一失败"),
        ("十分感谢", "十分感谢"),
        ("千万别删", "千万别删"),
        ("三点五十分", "3点50分"),
        ("没有数字的句子。", "没有数字的句子。"),
        ("abc 42 def", "abc 42 def"),
    ],
)
def test_chinese_to_arabic(text: str, expected: str) -> None:
    assert chinese_to_arabic(text) == expected


# --- the checker: numbers ---------------------------------------------------------------


def test_number_not_in_receipts_is_removed() -> None:
    result = check("我写好了。写了 12 字节。一共花了 30 元。", [write_receipt(12)])
    assert ("一共花了 30 元。", "number_not_in_receipts") in result.removed
    assert "30" not in result.text
    assert "12 字节" in result.text


def test_chinese_numerals_are_checked_as_numbers() -> None:
    kept = check("写了十二个字节。", [write_receipt(12)])
    assert kept.removed == []
    assert "写了十二个字节" in kept.text
    gone = check("写了十三个字节。", [write_receipt(12)])
    assert reasons(gone) == ["number_not_in_receipts"]
    assert "十三" not in gone.text


def test_a_unit_must_be_compatible_with_the_receipt_unit() -> None:
    assert check("写了12个文件。", [write_receipt(12)]).removed  # 12 byte, not 12 files
    assert not check("写了12 bytes。", [write_receipt(12)]).removed  # byte/bytes/字节/B
    money = receipt(values=[{"name": "金额", "value": 30, "unit": "CNY", "source": "bank"}])
    assert not check("付了30元。", [money]).removed
    assert check("付了30美元。", [money]).removed
    temp = receipt(values=[{"name": "气温", "value": 21, "unit": "°C", "source": "weather"}])
    assert not check("现在二十一度。", [temp]).removed
    assert units_compatible("个", "file") and not units_compatible("个", "byte")


def test_numbers_in_the_receipts_content_text_are_allowed() -> None:
    r = receipt(content={"text": "第二季度营收 4500 万，同比增长百分之八。"})
    kept = check("营收是4500万，增长了8%。", [r])
    assert kept.removed == []
    assert reasons(check("增长了9%。", [r])) == ["number_not_in_receipts"]


def test_percent_and_decimals_are_read_whole() -> None:
    r = receipt(values=[{"name": "进度", "value": 1.5, "unit": "%", "source": "s"}])
    assert check("进度一点五%。", [r]).removed == []
    assert check("进度 1.5%。", [r]).removed == []
    assert reasons(check("进度 1.6%。", [r])) == ["number_not_in_receipts"]
    assert split_sentences("大小 3.5 MB。好的") == ["大小 3.5 MB。", "好的"]


def test_an_article_like_one_is_not_a_count_claim() -> None:
    r = write_receipt(12)
    assert check("我帮你看了一下，写了一个备注。", [r]).removed == []
    # but a lone 一 with a unit that a receipt value uses is a count and is checked
    files = receipt(values=[{"name": "文件数", "value": 3, "unit": "file", "source": "fs"}])
    assert reasons(check("只有一个文件。", [files])) == ["number_not_in_receipts"]


# --- the checker: status words ---------------------------------------------------------


def test_done_needs_a_succeeded_receipt() -> None:
    assert check("已经发好了。", [receipt("succeeded")]).removed == []
    for status in ("unknown", "failed", "waiting", "running"):
        result = check("已经发好了。", [receipt(status)])
        assert reasons(result) == ["status_contradicts_receipts"], status
    assert reasons(check("Done, the message was sent.", [receipt("unknown")])) == ["status_contradicts_receipts"]
    assert reasons(check("办好了。", [])) == ["status_contradicts_receipts"]


def test_failed_and_still_working_need_matching_receipts() -> None:
    assert check("这次没有成功。", [receipt("failed")]).removed == []
    assert reasons(check("这次没有成功。", [receipt("succeeded")])) == ["status_contradicts_receipts"]
    for status in ("running", "queued", "waiting"):
        assert check("还在办。", [receipt(status)]).removed == []
    assert reasons(check("还在办。", [receipt("succeeded")])) == ["status_contradicts_receipts"]
    assert reasons(check("It is still in progress.", [receipt("failed")])) == ["status_contradicts_receipts"]


def test_a_negated_success_is_a_failure_claim_not_a_success_claim() -> None:
    # "没有成功" contains "成功" but must not count as a done claim
    assert check("发送没有成功。", [receipt("failed")]).removed == []
    assert reasons(check("只完成了一部分。", [receipt("succeeded")])) == ["status_contradicts_receipts"]
    assert check("只完成了一部分。", [receipt("partial")]).removed == []


def test_a_question_claims_no_status() -> None:
    assert check("要我看看发好了吗？", [receipt("unknown")]).removed == []


def test_noted_needs_a_verified_owner_data_or_workspace_effect() -> None:
    def noted(category: str, verification: str, status: str = "succeeded") -> list[str]:
        r = receipt(status, effects=[{"target": "备忘", "action": "save", "category": category,
                                      "verification": verification}])
        return reasons(check("好的，记下了。", [r], facts=[]))

    assert noted("owner_data", "verified") == []
    assert noted("workspace", "verified") == []
    assert noted("observe", "verified") == ["noted_without_verified_effect"]
    assert noted("send", "verified") == ["noted_without_verified_effect"]
    assert noted("owner_data", "not_verified") == ["noted_without_verified_effect"]
    assert noted("owner_data", "service_ack") == ["noted_without_verified_effect"]
    assert noted("owner_data", "verified", status="unknown") == ["noted_without_verified_effect"]
    assert reasons(check("好的，记下了。", [], facts=[])) == ["noted_without_verified_effect"]
    assert reasons(check("Saved.", [receipt("succeeded")], facts=[])) == ["noted_without_verified_effect"]


# --- the checker: delivered and read need a read-back ---------------------------------------

ALICE_SEND = {"target": "alice@example.com", "action": "send", "category": "send", "verification": "service_ack"}
ALICE_DELIVERED = {"target": "alice@example.com", "action": "deliver", "category": "send", "verification": "verified"}
ALICE_SEEN = {"target": "alice@example.com", "action": "seen", "category": "send", "verification": "verified"}


def old_maildir_send_receipt() -> dict[str, Any]:
    """Exactly what the messaging pack returned for a send before issue 37: a Maildir it
    wrote itself, claimed as a verified send."""
    return receipt(
        "succeeded",
        summary="sent 'A note from Yimi's owner' to alice@example.com",
        effects=[{"target": "alice@example.com", "action": "send", "verification": "verified"}],
        values=[{"name": "recipients", "value": 1, "unit": "person", "source": "local maildir"},
                {"name": "size", "value": 412, "unit": "byte", "source": "local maildir"},
                {"name": "replayed", "value": False, "unit": None, "source": "local maildir"}],
        content={"items": [{"message_id": "<1@yimi.localhost>", "folder": "sent", "to": "alice@example.com",
                            "subject": "A note from Yimi's owner", "date": "2026-12-03T08:00:00+00:00"}]},
        next={"retry": "forbidden"},
    )


def normalized_send(raw: dict[str, Any]) -> dict[str, Any]:
    from capabilities.receipts import normalize

    return normalize(raw, tool=None, category="send").receipt


@pytest.mark.parametrize("voice", [False, True], ids=["text", "voice"])
def test_an_old_maildir_send_receipt_cannot_back_alice_will_receive_it(voice: bool) -> None:
    r = normalized_send(old_maildir_send_receipt())
    assert r["effects"] == [{**ALICE_SEND}] and r["status"] == "succeeded"
    facts = render_facts(r, tool_label="messaging send", key="call-0")
    result = check("发好了，Alice 会收到。", [r], facts=facts, voice=voice)
    assert result.removed == [("发好了，Alice 会收到。", "delivery_not_proven")]
    honest = TEMPLATES["effects.service_ack.send"]
    assert (honest.voice if voice else honest.owner.format(target="alice@example.com")) in result.text
    for word in ("会收到", "已核实", "已送达", "已发送"):
        assert word not in result.text, result.text
    # streamed sentence by sentence, the same
    stream = ReplyCheck(receipts=[r], delivered_fact_ids=set(), facts=facts, voice=voice)
    assert stream.feed("发好了，Alice 会收到。") == ""
    stream.finish()
    assert stream.result().text == result.text


@pytest.mark.parametrize("voice", [False, True], ids=["text", "voice"])
def test_a_verified_deliver_effect_backs_alice_will_receive_it(voice: bool) -> None:
    raw = old_maildir_send_receipt()
    raw["effects"].append({"target": "alice@example.com", "action": "deliver", "verification": "verified"})
    r = normalized_send(raw)
    assert r["effects"] == [ALICE_SEND, ALICE_DELIVERED]
    result = check("发好了，Alice 会收到。", [r], voice=voice)
    assert result.removed == [] and result.text.startswith("发好了，Alice 会收到。")
    assert "是否送达还不知道" not in result.text and "还不知道是否送达" not in result.text  # the read-back answered it
    for sentence in ("Alice 已送达。", "It was delivered to alice@example.com.", "她会收到的。"):
        assert check(sentence, [r], voice=voice).removed == [], sentence


def test_delivered_and_read_need_a_read_back_of_the_named_target() -> None:
    acked = receipt("succeeded", effects=[ALICE_SEND])
    bob = {"target": "bob@example.com", "action": "send", "category": "send", "verification": "service_ack"}
    delivered = receipt("succeeded", effects=[ALICE_SEND, ALICE_DELIVERED, bob])
    seen = receipt("succeeded", effects=[ALICE_SEND, ALICE_SEEN])
    for sentence in ("Alice 已送达。", "消息送达了。", "She will receive it.", "Delivered.", "Alice 能收到。"):
        assert reasons(check(sentence, [acked])) == ["delivery_not_proven"], sentence
        assert reasons(check(sentence, [])) == ["delivery_not_proven"], sentence  # no receipt at all
    for sentence in ("Alice 已读。", "Alice has read it."):
        assert reasons(check(sentence, [acked])) == ["read_not_proven"], sentence
        assert reasons(check(sentence, [delivered])) == ["read_not_proven"], sentence  # arrived is not read
        assert check(sentence, [seen]).removed == [], sentence  # her read receipt
    assert check("Alice 会收到。", [seen]).removed == []  # read implies arrived
    # Bob's send was only acknowledged: naming him is not backed by Alice's read-back
    assert reasons(check("bob@example.com 会收到。", [delivered])) == ["delivery_not_proven"]
    assert reasons(check("Bob 会收到。", [delivered])) == ["delivery_not_proven"]
    assert check("Alice 会收到。", [delivered]).removed == []
    # a server's word, however sure, is not a read-back: service_ack deliver proves nothing
    shaky = receipt("succeeded", effects=[{**ALICE_DELIVERED, "verification": "service_ack"}])
    assert reasons(check("Alice 会收到。", [shaky])) == ["delivery_not_proven"]


@pytest.mark.parametrize("sentence", [
    "Alice 不会收到。", "还不知道她会不会收到。", "Alice 会收到吗？", "是否已送达还不知道。", "还没送达。",
    "不清楚她能不能收到。", "I'm not sure she will receive it.", "I can't tell whether it was delivered.",
    "I'll tell you once it is delivered.", "如果 Alice 会收到，我会告诉你。", "她还没有已读。",
])
def test_a_negated_doubted_or_conditional_delivery_is_not_a_claim(sentence: str) -> None:
    assert claims.proof_claims(sentence) == set(), sentence
    assert check(sentence, [receipt("succeeded", effects=[ALICE_SEND])]).removed == [], sentence


def test_a_clause_before_does_not_negate_the_claim_after_it() -> None:
    assert claims.proof_claims("不用担心，Alice 会收到的。") == {"delivered"}
    assert claims.proof_claims("没问题，已送达。") == {"delivered"}
    assert claims.proof_claims("Don't worry, she will receive it.") == {"delivered"}
    assert claims.proof_claims("Alice 已读，也已送达。") == {"read", "delivered"}


@pytest.mark.parametrize("sentence", [
    "我已读取了你的日历。", "已读取 notes.md。", "快递到了你会收到通知。", "到时候你会收到一条提醒。",
    "You will receive a notification when it arrives.", "You'll get a reminder at eight; you will receive the notice here.",
])
def test_a_read_of_data_or_a_notice_of_her_own_is_not_a_delivery_or_read_claim(sentence: str) -> None:
    """已读取 is a tool's read of data and 会收到通知 Yimi's own notice to the owner: neither says a
    message reached someone, so neither needs a read-back (each would be cut on every calendar
    read and every watch's confirmation otherwise)."""
    assert claims.proof_claims(sentence) == set(), sentence
    assert check(sentence, [receipt("succeeded", effects=[ALICE_SEND])]).removed == [], sentence


def test_a_delivery_or_read_of_a_message_is_still_a_claim_beside_those_words() -> None:
    assert claims.proof_claims("Alice 会收到邮件。") == {"delivered"}
    assert claims.proof_claims("Alice 已读你的消息。") == {"read"}
    assert claims.proof_claims("Alice will receive the message.") == {"delivered"}


def test_the_normalizer_downgrades_a_verified_send_to_a_service_ack() -> None:
    from capabilities.receipts import normalize

    for action in ("send", "Send", " send "):
        raw = receipt("succeeded", effects=[{"target": "alice@example.com", "action": action, "verification": "verified"}])
        out = normalize(raw, tool=None, category="send")
        assert out.receipt["effects"][0]["verification"] == "service_ack", action
        assert out.receipt["status"] == "succeeded" and not out.contradictions  # a server's acceptance is still a success
        assert [v.split(":")[0] for v in out.violations] == ["send_verified_without_readback"]
        assert raw["effects"][0]["verification"] == "verified"  # the pack's own receipt is not touched
        assert normalize(out.receipt, tool=None, category="send").violations == []  # once is enough
    # whatever category a pack declares: a send is a send
    raw = receipt("succeeded", effects=[{"target": "alice", "action": "send", "verification": "verified"}])
    assert normalize(raw, tool=None, category="workspace").receipt["effects"][0]["verification"] == "service_ack"
    # a read-back, and every other verified effect, stay as they are
    raw = receipt("succeeded", effects=[{"target": "alice@example.com", "action": "deliver", "verification": "verified"},
                                        {"target": "local outbox", "action": "save", "verification": "verified"}])
    out = normalize(raw, tool=None, category="send")
    assert [e["verification"] for e in out.receipt["effects"]] == ["verified", "verified"] and not out.violations


# --- the checker: retries ----------------------------------------------------------------


def test_no_suggestion_to_redo_a_forbidden_retry() -> None:
    sent = receipt("succeeded", effects=[{"target": "张三", "action": "send", "verification": "verified"}],
                   next={"retry": "forbidden"})
    for sentence in ("要不要再发一次？", "我可以重新发送。", "需要的话我可以再设一次。", "能不能重试一下？",
                     "Want me to resend it?", "Shall I try again?"):
        result = check(sentence, [sent], facts=[])
        assert reasons(result) == ["suggests_forbidden_retry"], sentence
        assert result.text == ""
    # a negated mention is not a suggestion
    assert check("不用再发一次。", [sent], facts=[]).removed == []
    # when retry is allowed, or the call did not succeed, suggesting it is fine
    allowed = receipt("failed", next={"retry": "allowed"})
    assert check("要不要再发一次？", [allowed], facts=[]).removed == []
    forbidden_failed = receipt("failed", next={"retry": "forbidden"})
    assert check("要不要再试一次？", [forbidden_failed], facts=[]).removed == []


# --- the checker: the diff ---------------------------------------------------------------


def test_delivered_facts_are_not_repeated() -> None:
    r = write_receipt(12)
    facts = render_facts(r, tool_label="写文件", key="call-0")
    status, effect, value = facts
    # number + unit of a delivered values fact
    result = check("文件大小是十二字节。", [r], delivered={value.id}, facts=facts)
    assert reasons(result) == ["repeats_delivered_fact"]
    # the text of a delivered fact
    result = check("「写文件」已完成。还有别的吗", [r], delivered={status.id}, facts=facts)
    assert ("「写文件」已完成。", "repeats_delivered_fact") in result.removed
    assert "还有别的吗" in result.text
    # not delivered yet: the same sentence is kept
    assert check("文件大小是十二字节。", [r], facts=facts).removed == []


def test_missing_facts_are_added_from_templates() -> None:
    r = write_receipt(12)
    facts = render_facts(r, tool_label="写文件", key="call-0")
    result = check("好的。", [r], facts=facts)
    assert result.added == facts
    assert result.text == "好的。「写文件」已完成。已写入 notes.md，已核实。写入大小：12 byte。"
    assert result.told == [f.id for f in facts]
    # delivered facts are not added again
    later = check("好的。", [r], delivered={facts[0].id}, facts=facts)
    assert [f.id for f in later.added] == [facts[1].id, facts[2].id]
    assert "已完成" not in later.text


def test_facts_the_reply_states_are_told_not_added() -> None:
    r = write_receipt(12)
    facts = render_facts(r, tool_label="写文件", key="call-0")
    result = check("办好了，notes.md 里写了十二个字节。", [r], facts=facts)
    assert result.removed == [] and result.added == []
    assert set(result.told) == {f.id for f in facts}
    assert result.text == "办好了，notes.md 里写了十二个字节。"


def test_a_removed_number_is_replaced_by_the_template_fact() -> None:
    r = write_receipt(12)
    result = check("写了十三个字节。", [r])
    assert "十三" not in result.text
    assert "写入大小：12 byte。" in result.text
    assert any(f.kind == "values" for f in result.added)


def test_voice_mode_appends_voice_versions() -> None:
    r = write_receipt(12)
    facts = render_facts(r, tool_label="写文件", key="call-0")
    result = check("", [r], facts=facts, voice=True)
    assert result.text == "".join(f.voice for f in facts)
    assert "「写文件」" not in result.text
    assert check("", [r], facts=facts, lang="zh-voice").text == result.text


def test_identical_added_texts_are_written_once() -> None:
    receipts = [receipt("running"), receipt("queued")]
    result = check("", receipts, voice=True)
    assert result.text == "还在办。"
    assert len(result.added) == 2 and len(result.told) == 2


def test_template_texts_agree_with_the_checker() -> None:
    # a reply that copies the system's own facts must never be cut
    for status in STATUSES:
        r = receipt(status)
        for fact in render_facts(r, tool_label="写文件", key="k"):
            for version in (fact.text, fact.voice):
                assert check(version, [r], facts=[]).removed == [], (status, version)
    r = receipt("succeeded", effects=[{"target": "张三", "action": "send", "verification": "verified"}],
                next={"retry": "forbidden"})
    for fact in render_facts(r, tool_label="发消息", key="k"):
        assert check(fact.text, [r], facts=[]).removed == [], fact.text
    # a send's honest wording claims no delivery; a read-back's wording is backed by itself
    for effects in ([ALICE_SEND], [ALICE_SEND, ALICE_DELIVERED], [ALICE_SEND, ALICE_SEEN]):
        r = receipt("succeeded", effects=effects)
        for fact in render_facts(r, tool_label="发消息", key="k"):
            for version in (fact.text, fact.voice):
                assert check(version, [r], facts=[]).removed == [], version


def test_sentences_split_on_chinese_and_english_marks_and_rejoin_losslessly() -> None:
    text = "好的！写了 3.5 MB；没问题?\nDone. Next line"
    parts = split_sentences(text)
    assert "".join(parts) == text
    assert [p.strip() for p in parts] == ["好的！", "写了 3.5 MB；", "没问题?", "Done.", "Next line"]


def test_the_checker_makes_no_model_or_network_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the checker must not open a connection")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    result = check("写了十三个字节。要不要再发一次？", [write_receipt(12)])
    assert reasons(result) == ["number_not_in_receipts"]
    import capabilities.truth as truth

    modules = sorted(Path(truth.__file__).parent.rglob("*.py"))
    assert len(modules) > 1
    for module in modules:
        source = module.read_text(encoding="utf-8")
        for forbidden in ("import brain", "from brain", "import django", "from django", "import requests", "import httpx"):
            assert forbidden not in source, f"{module.name}: {forbidden}"


def test_facts_after_a_draft_ending_in_a_colon_follow_it_without_a_full_stop() -> None:
    r = write_receipt(12)
    facts = render_facts(r, tool_label="写文件", key="call-0")
    assert check("这是写下的：", [r], facts=facts).text == "这是写下的：" + "".join(f.text for f in facts)
    assert check("Here is what the file says:", [r], facts=facts, lang="en").text.startswith("Here is what the file says: 「写文件」")
    assert check("写好了", [r], facts=facts).text.startswith("写好了。已写入 notes.md")  # other ends still get one


def test_the_quick_paths_answer_as_the_full_scans_do() -> None:
    """A sentence without any status phrase skips the six patterns; a text without a
    Chinese numeral skips the numeral scan. On sentences built to sit near both edges
    (phrases in any case, inside longer words, long s, Chinese numerals and idioms) each
    answers exactly as its full scan."""
    rng = random.Random(14)
    phrases = [p for _, words in claims.STATUS_WORDS for p in words]
    filler = ["the", "order", "condone", "presented", "failure", "ok", "ſent", "It", "was", "3", "20%", "4500 万",
              "一下", "十二", "两三个", "零下五度", "百分之五十", "then", ",", ".", "SENT", "Done!", "un-done",
              "“quoted”", "已经", "完", "记", "KELVIN", "İstanbul", "成"]
    sentences = [
        " ".join(rng.choice(phrases + filler) if rng.random() < 0.3 else rng.choice(filler) for _ in range(rng.randint(1, 9)))
        for _ in range(3000)
    ]
    sentences += ["Message sent.", "It is DONE", "I could not do it", "presented", "ſent it", "noted, thanks"]
    proof_phrases = [p for _, words in claims.PROOF_WORDS for p in words]
    sentences += [" ".join(rng.choice(proof_phrases + filler) for _ in range(rng.randint(1, 6))) for _ in range(1000)]
    for sentence in sentences:
        s = sentence.strip()
        if not (s.endswith(("?", "？")) or s.endswith("吗")):
            assert claims.status_claims(sentence) == claims._scan_status(s), sentence
            assert claims.proof_claims(sentence) == claims._scan_proof(s), sentence
        text = sentence.translate(numerals._FULLWIDTH)
        assert numerals._convert(sentence) == numerals._scan(text), sentence
    assert claims.status_claims("Message sent.") == {"done"} and claims.status_claims("presented") == set()
    assert claims.status_claims("Message ſent.") == {"done"}  # long s: IGNORECASE reads "sent"
    # The letters IGNORECASE folds into ASCII ones, all of them (the quick path's exceptions).
    ascii_letter = re.compile("[a-z]", re.IGNORECASE)
    assert {chr(c) for c in range(0x80, sys.maxunicode + 1) if ascii_letter.fullmatch(chr(c))} == claims.FOLDS_INTO_ASCII


# --- the owner's own words quoted back ---------------------------------------------------------------

SAID = "提醒我明天下午3点给妈妈打电话，她的号码尾号是8848"


def test_the_owners_quoted_words_keep_their_numbers_while_the_models_own_numbers_are_checked() -> None:
    reply = "你说的是「明天下午3点给妈妈打电话」。号码尾号是“8848”。一共花了 30 元。"
    result = check_reply(reply, receipts=[], delivered_fact_ids=set(), facts=[], owner_words=[SAID])
    assert result.text == "你说的是「明天下午3点给妈妈打电话」。"
    assert ("一共花了 30 元。", "number_not_in_receipts") in result.removed
    # 「8848」 alone is only digits: a bare number in quotes is still the model's to back
    assert ("号码尾号是“8848”。", "number_not_in_receipts") in result.removed
    # without her words, the quote's number is cut as before
    alone = check_reply(reply, receipts=[], delivered_fact_ids=set(), facts=[])
    assert alone.text == "" and [r for _, r in alone.removed] == ["number_not_in_receipts"] * 3


def test_a_quote_she_never_said_and_a_claim_beside_her_quote_are_still_cut() -> None:
    words = [SAID]
    kept = check_reply("你让我「明天下午三点给妈妈打电话」。", receipts=[], delivered_fact_ids=set(), facts=[], owner_words=words)
    assert kept.text == "你让我「明天下午三点给妈妈打电话」。"  # 三 read as 3, as she said it
    for reply in ("你说「明天下午4点给妈妈打电话」。", "你说「明天下午3点给妈妈打电话」，已经打了2次。",
                  "你说「明天下午3点给妈妈打电话」，我已经发好了。"):
        result = check_reply(reply, receipts=[], delivered_fact_ids=set(), facts=[], owner_words=words)
        assert result.text == "", reply
        assert result.removed[0][1] in ("number_not_in_receipts", "status_contradicts_receipts")


def test_a_quote_cut_in_two_by_a_full_stop_is_still_hers() -> None:
    said = "我说过：下午3点开会。然后5点去机场。"
    reply = "你说过「下午3点开会。然后5点去机场。」好的。"
    assert [p.strip() for p in split_sentences(reply)][:2] == ["你说过「下午3点开会。", "然后5点去机场。」"]
    result = check_reply(reply, receipts=[], delivered_fact_ids=set(), facts=[], owner_words=[said])
    assert result.text == reply and result.removed == []
    streamed = ReplyCheck(receipts=[], delivered_fact_ids=set(), facts=[], owner_words=[said])
    assert "".join(streamed.feed(p) for p in split_sentences(reply)) + streamed.finish() == reply
