"""Every word backed: the main agent's reply passes the deterministic checker before a
device sees it, nothing internal leaks to a device, and logs scrub secrets by value.

The dishonest brain is the demo brain (a real OpenAI-compatible server) with a script;
the device is a real ``WebsocketCommunicator`` on the device consumer.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.conf import settings as django_settings

from brain.agent_loop import DELEGATED_ACK
from brain.runner import NOTHING_BACKED, CheckedStream
from capabilities import truth
from memory.models import TimelineEntry
from tests.conftest import db_async, open_socket, receive_until, script
from yimi_project.leaks import find_markers, redact_markers
from yimi_project.logs import log_event

RUN_ID = "123e4567-e89b-12d3-a456-426614174000"


async def ask(sim: Any, text: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Say ``text`` over a real device socket; the reply's chunks and its reply.done."""
    comm, _ = await open_socket(sim)
    await comm.send_json_to({"type": "text", "id": "q", "text": text})
    await receive_until(comm, "text.ack")
    chunks: list[dict[str, Any]] = []
    while True:
        frame = await receive_until(comm, "reply.chunk", "reply.done", "notice", timeout=15)
        if frame["type"] != "reply.chunk":
            break
        chunks.append(frame)
    await comm.disconnect()
    assert frame["type"] == "reply.done", frame
    return chunks, frame


async def stored_reply() -> str:
    return await db_async(lambda: TimelineEntry.objects.get(kind="reply").text)()


def fresh_check() -> truth.ReplyCheck:
    return truth.ReplyCheck(receipts=[], delivered_fact_ids=set(), facts=[])


@pytest.mark.django_db(transaction=True)
async def test_main_turn_claims_without_receipts_are_removed_before_the_device_sees_them(make_device: Any, brain: Any) -> None:
    script(brain, match="发", chunk_chars=3,
           reply="好的，明白了。已经发好了。我已记下你的要求。一共3封邮件，明天8点提醒你。你想先看哪一封？")
    sim = await db_async(make_device)()
    chunks, done = await ask(sim, "把周报发给小林")
    said = "".join(c["text"] for c in chunks)
    assert said == "好的，明白了。你想先看哪一封？" == done["text"]
    assert [c["index"] for c in chunks] == list(range(len(chunks))) and len(chunks) == 2  # the first kept sentence at once, the other at the reply's end
    for claim in ("发好了", "记下", "3", "8"):
        assert claim not in said
    assert await stored_reply() == said  # the timeline holds exactly what the device received


@pytest.mark.django_db(transaction=True)
async def test_a_main_reply_with_nothing_backed_says_so_instead(make_device: Any, brain: Any) -> None:
    script(brain, match="记", reply="已记下。搞定，共 42 条。")
    sim = await db_async(make_device)()
    chunks, done = await ask(sim, "记一下明天开会")
    assert "".join(c["text"] for c in chunks) == done["text"] == NOTHING_BACKED == await stored_reply()
    assert truth.check_reply(NOTHING_BACKED, receipts=[], delivered_fact_ids=set(), facts=[]).text == NOTHING_BACKED


@pytest.mark.django_db(transaction=True)
async def test_a_delegating_reply_that_claims_the_result_keeps_only_the_acknowledgement(make_device: Any, brain: Any) -> None:
    script(brain, match="整理", forbids_tool="workspace__write_file", reply="已经写好了。",
           tool_calls=[{"name": "delegate", "arguments": {"goal": "整理纪要"}}])
    script(brain, match="Background task finished", reply="")
    sim = await db_async(make_device)()
    chunks, done = await ask(sim, "整理一下纪要")
    assert "".join(c["text"] for c in chunks) == done["text"] == DELEGATED_ACK


@pytest.mark.django_db(transaction=True)
async def test_internal_markers_in_a_main_reply_never_reach_the_device(make_device: Any, brain: Any) -> None:
    leaks = [
        f"运行编号是 {RUN_ID}。",
        "我调用了 notes__write_file 工具。",
        f"文件在 {django_settings.DATA_DIR}/workspace/a.txt 里。",
        "密钥是 sk-abcdefghijklmnop1234。",
        'File "/srv/yimi/brain/runner.py", line 42, in execute_run。',
        "Traceback (most recent call last): 出错了。",
    ]
    script(brain, match="看看", chunk_chars=5, reply="我看了一下。" + "".join(leaks) + "没有别的了。")
    sim = await db_async(make_device)()
    chunks, done = await ask(sim, "帮我看看")
    said = "".join(c["text"] for c in chunks)
    assert said == done["text"] == "我看了一下。没有别的了。" == await stored_reply()
    assert find_markers(said) == []


def test_leak_markers_are_found_and_redacted_deterministically() -> None:
    cases = {
        RUN_ID: "uuid", "a" * 8 + "0" * 24: "uuid", "outbox__send": "tool", f"{django_settings.DATA_DIR}/yimi.sqlite3": "data_path",
        "Bearer abcdefgh12345678": "token", "postgres://u:pw@db/x": "credential_url", "ValueError: bad": "stack",
    }
    for marker, kind in cases.items():
        assert kind in find_markers(f"看这里 {marker} 就好"), marker
        assert marker not in redact_markers(f"看这里 {marker} 就好")
    for clean in ("明天 8 点开会。", "S3 存储桶", "notes/a.txt", "YIMI_BRAIN_BASE_URL", "3.5 公里"):
        assert find_markers(clean) == [], clean


def test_report_checker_removes_marker_sentences_and_redacts_markers_in_added_facts() -> None:
    target = f"{django_settings.DATA_DIR}/workspace/notes.md"
    receipt = {"receipt_schema": 1, "status": "succeeded",
               "effects": [{"target": target, "action": "write", "category": "workspace", "verification": "verified"}]}
    facts = truth.render_facts(receipt, tool_label="写文件", key="call-0")
    result = truth.check_reply(f"写好了。调用 {RUN_ID} 成功。", receipts=[receipt], delivered_fact_ids=set(), facts=facts)
    assert ("调用 " + RUN_ID + " 成功。", "internal_marker") in result.removed
    assert str(django_settings.DATA_DIR) not in result.text and "[redacted]" in result.text
    assert result.text.startswith("写好了。")


async def test_first_chunk_leaves_when_the_first_sentence_is_complete() -> None:
    sent: list[str] = []

    async def send(piece: str) -> None:
        sent.append(piece)

    stream = CheckedStream(send, fresh_check())
    for delta in ("好的", "，我", "看看。"):
        await stream(delta)
    assert sent == []  # "看看。" may still be followed by a closing mark
    await stream("已经")
    assert sent == ["好的，我看看。"]  # the first sentence, before the model has finished
    await stream("发好了。你")
    assert sent == ["好的，我看看。"]  # the unbacked claim never leaves
    await stream("还要别的吗？")
    assert await stream.close(fallback="x") == "好的，我看看。你还要别的吗？"
    assert sent == ["好的，我看看。", "你还要别的吗？"]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 100])
async def test_streamed_check_equals_check_reply_for_any_delta_size(size: int) -> None:
    text = "  Noted.  The file is 12 byte. 3.5 km away.\n已经发好了！「好」。还有吗？ "
    receipt = {"receipt_schema": 1, "status": "failed", "values": [{"name": "距离", "value": 3.5, "unit": "km", "source": "x"}]}
    facts = truth.render_facts(receipt, tool_label="查距离", key="call-0")
    sent: list[str] = []

    async def send(piece: str) -> None:
        sent.append(piece)

    stream = CheckedStream(send, truth.ReplyCheck(receipts=[receipt], delivered_fact_ids=set(), facts=facts))
    for i in range(0, len(text), size):
        await stream(text[i : i + size])
    final = await stream.close(fallback="x")
    expected = truth.check_reply(text, receipts=[receipt], delivered_fact_ids=set(), facts=facts).text
    assert final == "".join(sent) == expected and "3.5" in expected and "12" not in expected


def test_logs_scrub_secret_values_whatever_the_key(caplog: pytest.LogCaptureFixture) -> None:
    detail = (f"connect postgres://yimi:hunter2@db:5432/yimi failed; Bearer abcdefgh12345678 sent; "
              f"see {django_settings.DATA_DIR}/logs/x.log")
    with caplog.at_level(logging.INFO, logger="yimi"):
        log_event("probe_failed", detail=detail, run_id=RUN_ID, nested={"why": ["sk-abcdefghijklmnop1234"]}, api_key="k")
    [record] = [r for r in caplog.records if r.getMessage() == "probe_failed"]
    fields = record.yimi_fields
    assert "hunter2" not in fields["detail"] and "abcdefgh12345678" not in fields["detail"]
    assert str(django_settings.DATA_DIR) not in fields["detail"] and "failed" in fields["detail"]
    assert fields["nested"] == {"why": ["[redacted]"]} and fields["api_key"] == "[redacted]"
    assert fields["run_id"] == RUN_ID  # ids stay: they are how logs are read


async def test_the_platforms_own_sentences_pass_while_the_models_claims_do_not() -> None:
    from brain import agent_loop

    sent: list[str] = []

    async def send(piece: str) -> None:
        sent.append(piece)

    honest = agent_loop.NOT_STARTED.format(reason="后台任务已满")
    stream = CheckedStream(send, fresh_check())
    for delta in ("好的。已经发好了", honest):
        await stream(delta)
    assert await stream.close(fallback="x") == "好的。" + honest == "".join(sent)


@pytest.mark.django_db(transaction=True)
async def test_the_owners_words_quoted_back_reach_the_device_while_an_unbacked_number_does_not(make_device: Any, brain: Any) -> None:
    script(brain, match="妈妈", chunk_chars=4,
           reply="好的，你说的是「明天下午3点给妈妈打电话」。这周你已经打了5次。要我现在设提醒吗？")
    sim = await db_async(make_device)()
    chunks, done = await ask(sim, "提醒我明天下午3点给妈妈打电话")
    said = "".join(c["text"] for c in chunks)
    assert said == done["text"] == "好的，你说的是「明天下午3点给妈妈打电话」。要我现在设提醒吗？" == await stored_reply()


@pytest.mark.django_db(transaction=True)
async def test_a_task_report_may_quote_what_the_owner_asked_and_added(make_device: Any, brain: Any) -> None:
    from brain import agents
    from brain.agent_loop import execute_agent_task
    from brain.models import Run
    from brain.services import accept_utterance
    from tests.conftest import new_client_id

    sim = await db_async(make_device)()
    run = await db_async(lambda: Run.objects.get(id=accept_utterance(sim.device, new_client_id(), "查一下明天下午3点的会在几楼").run_id))()
    task = await db_async(agents.delegate)(run.id, "find the room of tomorrow's 3 pm meeting")
    await db_async(agents.steer)(run.id, task.id, "会议室要能坐8个人")
    script(brain, match="Background task finished",
           reply="关于「明天下午3点的会在几楼」和「会议室要能坐8个人」：我没找到日程。会议在12楼。")
    script(brain, match="find the room", reply="No calendar to look in.")
    await execute_agent_task(task.id)
    report = await db_async(TimelineEntry.objects.get)(kind="reply")
    assert report.text.startswith("关于「明天下午3点的会在几楼」和「会议室要能坐8个人」：我没找到日程。")
    assert "12楼" not in report.text  # the model's own number, backed by nothing
