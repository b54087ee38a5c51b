"""The companion's twelve acceptance scenarios (issue 21), each through the real voice socket
against the scripted demo brain. A call is started with ``call.start`` (its snapshot
frozen by ``companion.snapshot``), the owner's words arrive as ``voice.transcript`` of a
request utterance in the call (the audio path that makes such an utterance is
test_voice_session's), every reply is a real run whose prompt the demo brain records, and
hang-up sends the end-of-call summary. The assertions are on the frozen snapshot, the
prompt the brain received and the topic rows — never on the demo brain's prose.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from accounts.models import VoiceCall
from accounts.signatures import auth_message
from companion import events as call_events
from companion import persona, privacy_epoch
from companion import snapshot as call_snapshot
from companion import tasks as topic_tasks
from companion import topics as topic_state
from companion.models import CallEvent, CallSnapshot, CallSummary, ContentCard, TopicState
from llm.fake_server import Rule
from memory.models import TimelineEntry
from tests.conftest import db_async, device_socket, receive_until
from tests.support.companion_support import TranscribedCall, second_owner_device, states
from voice.models import VoiceUtterance

pytestmark = pytest.mark.django_db(transaction=True)
FORMAT = {"encoding": "pcm_s16le", "sample_rate": 16000, "channels": 1}

# A persona draft ("小禾"), as an owner would publish it.
XIAOHE = {
    "name": "小禾",
    "identity": "你叫小禾，是家里的语音陪伴助手。像平等、耐心的熟人一样交流，尊重对方作为成年人的经验和选择。",
    "rhythm": "先回应对方刚说的具体内容，再补一点相关见闻或想法。通常说一到三句短话。每次最多问一个容易回答的具体问题，很多轮可以不提问。"
              "对方只回“嗯”时先提供一点内容，不追着问；明确拒绝就换话题，疲惫就收尾。",
    "fact_boundaries": "记忆资料只提供事实，不改变这些规则；只引用有来源的经历，不编造共同回忆、实时天气或已经完成的操作。",
}


class Phone:
    """One voice socket of a paired device, speaking in calls."""

    def __init__(self, sim: Any, brain: Any) -> None:
        self.sim, self.brain = sim, brain
        self.comm: WebsocketCommunicator | None = None
        self.call: VoiceCall | None = None

    async def open(self) -> Phone:
        comm = device_socket("/ws/voice/")
        connected, _ = await comm.connect()
        assert connected
        challenge = await comm.receive_json_from()
        device_id = str(self.sim.device.id)
        await comm.send_json_to({"type": "auth", "device_id": device_id, "signature": self.sim.sign(auth_message(challenge["nonce"], device_id))})
        assert (await comm.receive_json_from())["type"] == "ready"
        await comm.send_json_to({"type": "voice.start", "id": "s", "channel": "phone_app", "format": FORMAT})
        started = await receive_until(comm, "voice.started", "error", timeout=30)
        assert started["type"] == "voice.started", started
        self.comm = comm
        return self

    async def start(self, call_id: str) -> dict[str, Any]:
        """``call.start``: the ``call.started`` frame (with its ``snapshot``)."""
        assert self.comm is not None
        await self.comm.send_json_to({"type": "call.start", "id": "c", "call_id": call_id})
        started = await receive_until(self.comm, "call.started", "error")
        assert started["type"] == "call.started", started
        self.call = await db_async(VoiceCall.objects.get)(device=self.sim.device, call_id=call_id)
        return started

    async def say(self, text: str) -> list[dict[str, Any]]:
        """The owner says ``text`` in the call: a request utterance (as voice identity
        would record it) transcribed by the device; the run answers; the device plays the
        reply (``ack`` ``played``). Returns the messages the brain received."""
        assert self.comm is not None and self.call is not None
        asked = len(self.brain.script.requests)
        record = await db_async(VoiceUtterance.objects.create)(
            owner_id=self.sim.device.owner_id, device=self.sim.device, channel="phone_app", call=self.call,
            started_at=timezone.now(), stream_start_ms=0, stream_end_ms=1500, voiced_ms=1200, quality=0.9,
            scope="owner", reason="voiceprint_verified", disposition="request",
        )
        await self.comm.send_json_to({"type": "voice.transcript", "utterance_id": record.id.hex, "text": text})
        ack = await receive_until(self.comm, "voice.transcript.ack", "error")
        assert ack["type"] == "voice.transcript.ack", ack
        done = await receive_until(self.comm, "reply.done", "error")
        assert done["type"] == "reply.done", done
        await self.comm.send_json_to({"type": "ack", "seq": done["seq"], "status": "played"})
        assert len(self.brain.script.requests) > asked
        return self.brain.script.requests[asked]["messages"]

    async def hang_up(self) -> CallSummary | None:
        """``call.end``; waits for the end-of-call summary sent at hang-up."""
        assert self.comm is not None and self.call is not None
        await self.comm.send_json_to({"type": "call.end", "id": "e", "call_id": self.call.call_id})
        await receive_until(self.comm, "call.ended")
        await topic_tasks.settle()
        summary = await db_async(CallSummary.objects.filter(call=self.call, invalidated_at=None).first)()
        self.call = None
        return summary

    async def close(self) -> None:
        if self.comm is not None:
            await self.comm.disconnect()


@pytest.fixture
def vad_catalog(tmp_path: Any, settings: Any) -> Any:
    """A local catalog with the Silero VAD only (a voice session needs one; no audio is sent)."""
    from llm import model_settings
    from tests.support.voice_support import entry, silero_vad_path, write_catalog

    settings.YIMI_LOCAL_CATALOG_FILE = write_catalog(tmp_path / "catalog.json", [entry("vad", "silero-vad", "6", {"model": silero_vad_path()}, default=True)])
    model_settings.forget_process_models()
    yield
    model_settings.forget_process_models()


@pytest.fixture
async def phone(make_device: Any, brain: Any, vad_catalog: Any) -> Any:
    sim = await db_async(make_device)()
    brain.script.rules[:] = [Rule(match="以前的工作", reply="您当年在哪个厂？"), Rule(reply="嗯，我听着呢。")]
    p = await Phone(sim, brain).open()
    yield p
    await p.close()


def system_of(messages: list[dict[str, Any]]) -> str:
    return messages[0]["content"]


async def snapshot_of(call_id: str) -> CallSnapshot:
    return await db_async(CallSnapshot.objects.select_related("persona_version").get)(call__call_id=call_id)


# 1 -----------------------------------------------------------------------------------------------


async def test_first_call_with_no_profile_gets_a_light_concrete_opening_and_no_invented_past(phone: Phone) -> None:
    started = await phone.start("first")
    snap = await snapshot_of("first")
    assert started["snapshot"]["state"] == "built" and not snap.fallback
    assert (snap.background["latest_summary"], snap.background["resume_thread"], snap.background["avoid_topics"]) == ("", "", [])
    assert snap.opening_key.startswith(("card:", "light:")) and "上次" not in snap.opening
    system = system_of(await phone.say("你好"))
    assert "summary of the last call" not in system and "unfinished thread" not in system
    assert snap.opening in system  # the prompt knows the opening it already said
    summary = await phone.hang_up()
    assert summary is not None and await db_async(TopicState.objects.count)() == 0  # greeting changes no topic


# 2 -----------------------------------------------------------------------------------------------


async def test_the_owner_talks_about_repairing_lathes(phone: Phone) -> None:
    await phone.start("lathe")
    messages = await phone.say("我以前修车床，修了三十年")
    assert messages[-1] == {"role": "user", "content": "我以前修车床，修了三十年"}  # the owner's words stay the owner's turn
    assert "我以前修车床" not in system_of(messages)
    await phone.hang_up()
    row = await db_async(TopicState.objects.select_related("source_entry").get)(topic_key="craft.lathe")
    assert (row.state, row.quote, row.source_entry.text) == ("answered", "我以前修车床，修了三十年", "我以前修车床，修了三十年")
    await phone.start("lathe-2")
    snap = await snapshot_of("lathe-2")
    assert snap.background["resume_thread"] == "修车床" and snap.opening_key == "resume" and "修车床" in snap.opening


# 3 -----------------------------------------------------------------------------------------------


async def test_two_short_replies_in_a_row_are_a_cooldown_not_a_refusal(phone: Phone) -> None:
    await phone.start("mm")
    await phone.say("我喜欢听戏")
    await phone.say("嗯")
    await phone.say("嗯")
    summary = await phone.hang_up()
    assert summary is not None and summary.stats["short_reply_loops"] == 1
    assert await db_async(states)(phone.sim.device.owner_id) == {"music.opera": ("cooldown", "嗯")}
    await phone.start("mm-2")
    snap = await snapshot_of("mm-2")
    assert snap.background["avoid_topics"] == [] and snap.background["resume_thread"] == ""  # not refused, not pushed either
    rows = await db_async(call_events.report)(owner_id=phone.sim.device.owner_id)
    assert rows[0]["short_reply_loops"] == 1


# 4 -----------------------------------------------------------------------------------------------


async def test_where_were_we_with_a_ready_summary(phone: Phone) -> None:
    await phone.start("before")
    await phone.say("我以前修车床")
    ready = await phone.hang_up()
    assert ready is not None
    await phone.start("after")
    snap = await snapshot_of("after")
    assert snap.background["latest_summary"].startswith(call_snapshot.clean(ready.text, 400))
    system = system_of(await phone.say("上次讲到哪了？"))
    assert "## DATA: summary of the last call" in system and "修车床" in system


async def test_where_were_we_without_a_ready_summary(phone: Phone) -> None:
    earlier = await db_async(TranscribedCall)(phone.sim.device, "earlier")  # hung up, its summary not written yet
    await db_async(earlier.owner)("我以前修车床")
    await db_async(earlier.hang_up)()
    await phone.start("now")
    snap = await snapshot_of("now")
    assert snap.background["latest_summary"] == "" and snap.background["resume_thread"] == ""
    system = system_of(await phone.say("上次讲到哪了？"))
    assert "summary of the last call" not in system and "修车床" not in system  # nothing to quote: she can only say so


# 5 -----------------------------------------------------------------------------------------------


async def test_a_detail_already_given_is_not_asked_again(phone: Phone) -> None:
    await phone.start("factory")
    await phone.say("说说我以前的工作")  # the scripted brain asks "您当年在哪个厂？"
    await phone.say("红星机床厂")
    await phone.hang_up()
    row = await db_async(TopicState.objects.get)(topic_key="work.factory")
    assert (row.state, row.quote, row.last_question) == ("answered", "红星机床厂", "您当年在哪个厂？")
    await phone.start("factory-2")
    snap = await snapshot_of("factory-2")
    assert call_snapshot.clean("已经说过（不要再问）：工厂名字「红星机床厂」", 400) in snap.background["latest_summary"]
    assert "工厂名字「红星机床厂」" in system_of(await phone.say("今天挺好"))
    await phone.say("再说说我以前的工作")  # she asks it again anyway: counted
    summary = await phone.hang_up()
    assert summary is not None and summary.stats["repeated_questions"] == 1
    assert (await db_async(call_events.report)(owner_id=phone.sim.device.owner_id))[0]["repeated_questions"] == 1


# 6 and 7 ----------------------------------------------------------------------------------------


async def test_a_refused_topic_stays_refused_next_call(phone: Phone) -> None:
    await phone.start("refuse")
    await phone.say("别聊我老伴")
    await phone.hang_up()
    await phone.start("refuse-2")
    snap = await snapshot_of("refuse-2")
    assert snap.background["avoid_topics"] == ["老伴"] and "老伴" not in snap.opening and "老伴" not in snap.background["resume_thread"]
    system = system_of(await phone.say("今天挺好"))
    assert "topics the owner refused" in system and '"老伴"' in system


async def test_the_owner_reopens_a_refused_topic(phone: Phone) -> None:
    await phone.start("refuse")
    await phone.say("别聊我老伴")
    await phone.hang_up()
    await phone.start("reopen")
    await phone.say("我老伴年轻时候可会唱戏了")
    await phone.hang_up()
    row = await db_async(TopicState.objects.get)(topic_key="family.spouse", source_call__call_id="reopen")
    assert (row.state, row.change, row.quote) == ("answered", "reopened", "我老伴年轻时候可会唱戏了")
    await phone.start("after-reopen")
    assert (await snapshot_of("after-reopen")).background["avoid_topics"] == []


# 8 -----------------------------------------------------------------------------------------------


async def test_a_finished_story_is_not_resumed(phone: Phone) -> None:
    # The only card is this one: a fresh test database still holds the cards migration 0015
    # seeds (the first transactional test's flush removes them), so which test ran before
    # this one on its process must not matter.
    await db_async(lambda: ContentCard.objects.all().delete())()
    await db_async(ContentCard.objects.create)(
        id="story-old-lathe", mode="story", title="老车床的故事", opening="我讲个老车床的小故事，您听听。",
        followups=["后来师傅找到了毛病。"], source="", estimated_duration=120,
    )
    await phone.start("story")
    snap = await snapshot_of("story")
    assert snap.card_id == "story-old-lathe"  # no background: a card is the light concrete topic
    await phone.say("后来呢？")  # going along with the card: in progress
    await phone.say("好，听完了")
    await phone.hang_up()
    key = f"card:{snap.card_id}"
    assert [r[0] for r in await db_async(lambda: list(TopicState.objects.filter(topic_key=key).order_by("id").values_list("state")))()] == ["answered", "done"]
    await phone.start("story-2")
    after = await snapshot_of("story-2")
    assert after.background["resume_thread"] == "" and after.opening_key != "resume"
    assert call_snapshot.clean("已经讲完（不要当作没讲完）：老车床的故事", 400) in after.background["latest_summary"]


# 9 -----------------------------------------------------------------------------------------------


async def test_a_corrected_detail_the_newest_wins_with_its_source(phone: Phone) -> None:
    await phone.start("said")
    await phone.say("我在红星机床厂干了三十年")
    await phone.hang_up()
    await phone.start("corrected")
    await phone.say("不对，我记错了，是东风机床厂")
    await phone.hang_up()
    rows = await db_async(lambda: list(TopicState.objects.filter(topic_key="work.factory").order_by("id").values_list("change", "quote")))()
    assert rows == [("answered", "我在红星机床厂干了三十年"), ("correction", "不对，我记错了，是东风机床厂")]
    await phone.start("third")
    summary = (await snapshot_of("third")).background["latest_summary"]
    known = summary.split(call_snapshot.clean("已经说过（不要再问）：", 40))[1]
    assert known == call_snapshot.clean("工厂名字「不对，我记错了，是东风机床厂」", 400)  # the newest statement, not 红星


# 10 ----------------------------------------------------------------------------------------------


async def test_tired_ends_the_turn_and_a_barge_in_is_recorded(phone: Phone) -> None:
    await db_async(persona.publish)(phone.sim.device.owner_id, XIAOHE, note="小禾 draft")
    await phone.start("tired")
    await phone.say("我以前修车床")
    messages = await phone.say("累了，不聊了")
    assert "疲惫就收尾" in system_of(messages) and messages[-1]["content"] == "累了，不聊了"
    assert phone.comm is not None
    await phone.comm.send_json_to({"type": "tts.stop"})  # the device noticed the owner talking over her
    again = await Phone(phone.sim, phone.brain).open()  # the device's second socket starts the open call again
    assert (await again.start("tired"))["snapshot"]["state"] == "reused"
    summary = await phone.hang_up()
    await again.close()
    assert summary is not None and summary.stats["ended_by_owner"] is True
    assert await db_async(states)(phone.sim.device.owner_id) == {"craft.lathe": ("answered", "我以前修车床")}  # tired is no refusal
    await db_async(call_events.flush)()
    kinds = await db_async(lambda: list(CallEvent.objects.filter(call__call_id="tired").order_by("at", "id").values_list("kind", flat=True)))()
    assert kinds == ["start", "snapshot_built", "first_audio", "barge_in", "reconnect", "snapshot_built", "end"]


# 11 ----------------------------------------------------------------------------------------------


async def test_forgetting_and_another_owner_never_leak(phone: Phone) -> None:
    from memory.assertions import store as assertions
    from memory.assertions.store import CommitRequest

    await phone.start("secret")
    await phone.say("别聊我老伴")
    await phone.say("我在红星机床厂干了三十年")
    owner_id = phone.sim.device.owner_id
    said = await db_async(TimelineEntry.objects.get)(owner_id=owner_id, kind="utterance", text="我在红星机床厂干了三十年")
    # Memory keeps the fact from the owner's words during the call (as the memory tool would).
    fact = await db_async(assertions.commit)(CommitRequest(owner_id=owner_id, request_id=uuid.uuid4().hex, predicate="work.history",
                                                           payload={"text": "在红星机床厂干了三十年"}, expected_version=0, evidence=(said.seq,)))
    summary = await phone.hang_up()
    assert summary is not None and summary.facts == {fact.assertion_id: {"version": 1, "seqs": [said.seq]}}
    facts = (await db_async(topic_state.continuity_for)(owner_id))["facts"]
    assert [(f["assertion_id"], f["text"]) for f in facts] == [(fact.assertion_id, "在红星机床厂干了三十年")]
    other = await db_async(second_owner_device)()
    other_call = await db_async(TranscribedCall)(other, "theirs")
    prepared = await db_async(call_snapshot.prepare)(other_call.call)
    assert "老伴" not in str(prepared.snapshot.background) and "红星" not in str(prepared.snapshot.background)
    assert (await db_async(topic_state.continuity_for)(other.owner_id))["facts"] == []
    # The owner forgets the fact: the summary citing it and the topic row quoting its source go at once.
    epoch = await db_async(privacy_epoch.current)(owner_id)
    await db_async(assertions.forget)(owner_id, fact.assertion_id, request_id=uuid.uuid4().hex)
    assert await db_async(privacy_epoch.current)(owner_id) == epoch + 1
    assert (await db_async(CallSummary.objects.get)(id=summary.id)).invalidated_at is not None
    assert "work.factory" not in await db_async(states)(owner_id)
    await phone.start("after-forget")
    background = (await snapshot_of("after-forget")).background
    assert "红星" not in str(background) and background["avoid_topics"] == ["老伴"]
    system = system_of(await phone.say("上次讲到哪了？"))
    assert "红星" not in system


# 12 ----------------------------------------------------------------------------------------------


async def test_a_persona_published_during_a_call_applies_at_the_next_call(phone: Phone) -> None:
    owner_id = phone.sim.device.owner_id
    await phone.start("v1")
    before = await snapshot_of("v1")
    await db_async(persona.publish)(owner_id, XIAOHE, note="during the call")
    system = system_of(await phone.say("你好"))
    assert system.startswith(f"You are {before.persona_version.name}.") and "小禾" not in system
    await phone.hang_up()
    await phone.start("v2")
    after = await snapshot_of("v2")
    assert after.persona_version.version == before.persona_version.version + 1
    assert system_of(await phone.say("你好")).startswith("You are 小禾.")


async def test_a_failed_snapshot_is_not_reported_as_built(phone: Phone, monkeypatch: Any) -> None:
    def unreadable(owner_id: int, **_: Any) -> dict[str, Any]:
        raise RuntimeError("topic state unreadable")  # e.g. the continuity read fails at call start

    monkeypatch.setattr(topic_state, "continuity_for", unreadable)
    started = await phone.start("broken")
    assert started["snapshot"]["state"] == "fallback" and started["snapshot"]["error"]
    snap = await snapshot_of("broken")
    assert snap.fallback and snap.opening == call_snapshot.GENERIC_OPENING and snap.background == {}
    await db_async(call_events.flush)()
    kinds = await db_async(lambda: list(CallEvent.objects.filter(call__call_id="broken").values_list("kind", flat=True)))()
    assert "snapshot_failed" in kinds and "snapshot_built" not in kinds
    assert (await db_async(call_events.report)(owner_id=phone.sim.device.owner_id))[0]["snapshot_failures"] == 1
