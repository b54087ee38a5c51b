"""The frozen call snapshot (issue 21): built once at call.start from local data, reused on
a retried start, rebuilt after the privacy epoch moved, a documented fallback when it cannot
be built; one opening line from reviewable candidates; at most one content card; another
owner's data never reaches it; continuity can be switched off. Includes the real /ws/voice/
call.start."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from accounts.models import User, VoiceCall
from companion import persona, privacy_epoch
from companion import snapshot as call_snapshot
from companion.models import CallSnapshot, ContentCard, PrivacyEpoch
from companion.snapshot import Background, build_opening
from memory.assertions import store as assertions
from memory.assertions.store import CommitRequest
from memory.timeline import erasure
from memory.timeline.entries import append_entry
from tests.conftest import db_async, receive_until
from tests.support import voice_support
from tests.voice.test_voice_session import open_voice, start
from yimi_project.errors import YimiError

voice_assets = voice_support.voice_assets
voice_catalog = voice_support.voice_catalog

AT = datetime(2026, 12, 1, 12, 30, tzinfo=UTC)  # the owner's time zone is UTC: noon
WEATHER_OR_PLACE = re.compile(r"天气|下雨|下雪|气温|温度|晴|阴天|刮风|weather|rain|temperature|附近|位置|定位|你在哪|您在哪|城市|location")


def open_call(owner_id: int, device: Any, call_id: str) -> VoiceCall:
    call, _ = VoiceCall.objects.get_or_create(owner_id=owner_id, device=device, call_id=call_id, defaults={"channel": "phone_app"})
    return call


def believe(owner_id: int, predicate: str, text: str, request_id: str, **extra: Any) -> str:
    return assertions.commit(CommitRequest(owner_id, request_id, predicate, {"text": text, **extra}, 0)).assertion_id


def cards() -> list[ContentCard]:
    return list(ContentCard.objects.filter(active=True).order_by("id"))


# --- call start ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_call_start_freezes_one_snapshot_and_a_retried_start_reuses_it(make_device: Any, brain: Any) -> None:
    sim = make_device()
    owner_id = sim.device.owner_id
    believe(owner_id, "profile.address", "王师傅", "a")
    lathe = believe(owner_id, "interest.craft", "修车床", "i")
    call = open_call(owner_id, sim.device, "c1")
    first = call_snapshot.prepare(call, now=AT)
    snap = first.snapshot
    assert first.state == "built" and not snap.fallback and snap.error == ""
    assert snap.persona_version.version == 1 and snap.epoch == privacy_epoch.current(owner_id)
    assert snap.background["address"] == "王师傅"
    assert snap.background["interests"] == [{"text": "修车床", "assertion_id": lathe, "version": 1}]
    assert snap.opening == "王师傅，今天咱们聊点修车床的事，您也可以换个想聊的。" and snap.opening_key == f"interest:{lathe[:8]}"
    assert snap.card is not None and "修车床" in snap.card.tags  # at most one card, one that suits the interest
    assert snap.card_content["id"] == snap.card_id and snap.card_version == snap.card.version
    assert brain.script.requests == []  # nothing at call start asked a model

    believe(owner_id, "interest.garden", "养花", "i2")  # new background meanwhile: the call keeps what it started with
    ContentCard.objects.filter(id=snap.card_id).update(opening="改过的开场", version=snap.card_version + 1)
    again = call_snapshot.prepare(call, now=AT + timedelta(minutes=3))
    assert again.state == "reused" and again.snapshot.pk == snap.pk
    assert (again.snapshot.opening, again.snapshot.background, again.snapshot.card_content) == (snap.opening, snap.background, snap.card_content)
    assert again.snapshot.built_at == AT and CallSnapshot.objects.count() == 1
    assert again.frame() == {
        "state": "reused", "persona": {"version": 1, "name": "Yimi (依米)"}, "opening": snap.opening,
        "card": {"id": snap.card_id, "version": snap.card_version, "mode": snap.card_content["mode"]}, "continuity": True, "error": None,
    }


@pytest.mark.django_db
def test_a_snapshot_that_cannot_be_built_is_a_documented_fallback_and_is_retried(make_device: Any) -> None:
    sim = make_device()
    owner_id = sim.device.owner_id
    believe(owner_id, "interest.craft", "修车床", "i")
    call = open_call(owner_id, sim.device, "c1")

    def broken(owner_id: int, *, continuity: bool) -> Background:
        raise RuntimeError("the topic rows could not be read")

    failed = call_snapshot.prepare(call, now=AT, reader=broken)
    snap = failed.snapshot
    assert failed.state == "fallback" and snap.fallback and snap.error == "snapshot_failed: RuntimeError"
    assert (snap.opening, snap.background, snap.card_id, snap.opening_key) == (call_snapshot.GENERIC_OPENING, {}, None, "generic")
    assert failed.frame()["state"] == "fallback" and failed.frame()["error"] == "snapshot_failed" and failed.frame()["card"] is None
    prompt = call_snapshot.call_prompt(owner_id, sim.device.id)
    assert prompt is not None and prompt.startswith("You are Yimi (依米).") and "修车床" not in prompt  # persona + generic opening only

    persona.publish(owner_id, {"name": "小禾", "identity": "陪伴助手。", "rhythm": "短句。", "fact_boundaries": "不编造。"})
    retried = call_snapshot.prepare(call, now=AT + timedelta(seconds=5))
    assert retried.state == "rebuilt" and not retried.snapshot.fallback and retried.snapshot.error == ""
    assert retried.snapshot.attempts == 2 and "修车床" in retried.snapshot.opening
    assert retried.snapshot.persona_version.version == 1  # the call keeps the version it started with
    assert call_snapshot.prepare(call, now=AT).state == "reused"


@pytest.mark.django_db
def test_with_no_background_the_opening_offers_a_light_concrete_topic(make_device: Any) -> None:
    sim = make_device()
    built = call_snapshot.prepare(open_call(sim.device.owner_id, sim.device, "c1"), now=AT).snapshot
    assert built.background["interests"] == [] and built.card is not None
    assert built.opening == f"中午好。{built.card.opening}" and built.opening_key == f"card:{built.card_id}"
    assert "聊些什么" not in built.opening and "想聊什么" not in built.opening  # never asks the owner to pick a topic
    ContentCard.objects.update(active=False)
    bare = build_opening(Background(), [], local=AT, recent=[])
    assert (bare.key, bare.text, bare.card) == ("light:noon", "中午好。" + call_snapshot.LIGHT["noon"], None)


def test_the_opening_rotates_by_time_of_day_and_recent_calls() -> None:
    stub = [ContentCard(id=f"card-{n}", mode="chat", title=f"t{n}", opening=f"开场{n}", tags=[], estimated_duration=60) for n in range(4)]
    day = datetime(2026, 12, 1, tzinfo=UTC)
    by_hour = {h: build_opening(Background(), stub, local=day.replace(hour=h), recent=[]) for h in (8, 12, 15, 19, 23)}
    assert [o.text[:3] for o in by_hour.values()] == ["早上好", "中午好", "下午好", "晚上好", "您好。"]
    assert len({o.card.id for o in by_hour.values() if o.card}) > 1  # a different card at another time of day
    noon = by_hour[12]
    assert noon.card is not None
    after = build_opening(Background(), stub, local=day.replace(hour=12), recent=[(noon.key, noon.card.id)])
    assert after.card is not None and after.card.id != noon.card.id  # not what the last call opened with
    interests = Background(interests=[{"text": t, "assertion_id": f"{n}" * 8, "version": 1} for n, t in enumerate(["修车床", "下象棋", "养花"])])
    first = build_opening(interests, [], local=day.replace(hour=9), recent=[])
    second = build_opening(interests, [], local=day.replace(hour=9), recent=[(first.key, "")])
    assert first.key.startswith("interest:") and second.key.startswith("interest:") and second.key != first.key


def test_the_opening_resumes_one_thread_and_never_raises_a_topic_to_avoid() -> None:
    lathe = ContentCard(id="lathe", mode="story", title="老车床", opening="讲个老车床的故事。", tags=["车床"], estimated_duration=60)
    spouse = ContentCard(id="spouse", mode="reminiscence", title="老伴的故事", opening="聊聊老伴？", tags=["老伴"], estimated_duration=60)
    bg = Background(address="王师傅", resume_thread="找车床毛病的那次", interests=[{"text": "车床", "assertion_id": "a" * 36, "version": 1}])
    resumed = build_opening(bg, [lathe], local=AT, recent=[])
    assert resumed.key == "resume" and resumed.text == "王师傅，" + call_snapshot.RESUME.format(thread="找车床毛病的那次") and resumed.card is None
    avoid = Background(avoid_topics=["老伴"])
    for hour in range(24):
        opening = build_opening(avoid, [spouse, lathe], local=AT.replace(hour=hour), recent=[])
        assert opening.card is not None and opening.card.id == "lathe" and "老伴" not in opening.text


@pytest.mark.django_db
def test_no_candidate_or_shipped_card_names_the_weather_or_a_place(make_device: Any) -> None:
    texts = [call_snapshot.GENERIC_OPENING, call_snapshot.RESUME, call_snapshot.INTEREST, *call_snapshot.LIGHT.values(), *call_snapshot.GREETINGS.values()]
    texts += [c.opening for c in cards()] + [f for c in cards() for f in c.followups]
    assert len(cards()) == 10 and {c.mode for c in cards()} == {"chat", "reminiscence", "story", "guess"}
    assert [t for t in texts if WEATHER_OR_PLACE.search(t)] == []
    assert all("编的" in c.opening for c in cards() if c.mode == "story" and not c.source)  # a story without a source says it is a story
    sim = make_device()
    owner_id = sim.device.owner_id
    believe(owner_id, "location.home", "住在杭州西湖边", "l")
    believe(owner_id, "weather.today", "今天下雨", "w")
    snap = call_snapshot.prepare(open_call(owner_id, sim.device, "c1"), now=AT).snapshot
    assert "杭州" not in str(snap.background) + snap.opening and "下雨" not in str(snap.background) + snap.opening


@pytest.mark.django_db
def test_the_background_keeps_to_its_limits_and_leaves_out_respond_only_facts(make_device: Any) -> None:
    sim = make_device()
    owner_id = sim.device.owner_id
    for n in range(8):
        believe(owner_id, f"interest.n{n}", f"爱好{n}" + "很长" * 30, f"i{n}")
    believe(owner_id, "interest.secret", "不想被主动提起的事", "s", respond_only=True)
    believe(owner_id, "interest.dup", "爱好7" + "很长" * 30, "d")  # the same text twice counts once
    bg = call_snapshot.read_background(owner_id, continuity=True)
    assert len(bg.interests) == call_snapshot.MAX_INTERESTS and all(len(i["text"]) == call_snapshot.INTEREST_CHARS for i in bg.interests)
    assert len({i["text"] for i in bg.interests}) == len(bg.interests)
    assert "不想被主动提起的事" not in str(bg.as_json())
    assert bg.chars() <= call_snapshot.BACKGROUND_CHARS
    assert {s["id"] for s in bg.sources} == {i["assertion_id"] for i in bg.interests}


# --- privacy epoch -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_forgetting_moves_the_epoch_and_the_snapshot_is_invalid_at_once(make_device: Any) -> None:
    sim = make_device()
    owner_id = sim.device.owner_id
    lathe = believe(owner_id, "interest.craft", "修车床的手艺", "i")
    call = open_call(owner_id, sim.device, "c1")
    snap = call_snapshot.prepare(call, now=AT).snapshot
    assert "修车床的手艺" in str(snap.background) and "修车床的手艺" in snap.opening
    believe(owner_id, "interest.chess", "下象棋", "c")
    before = privacy_epoch.current(owner_id)

    result = assertions.forget(owner_id, lathe, request_id="f")
    assert privacy_epoch.current(owner_id) == before + 1
    assert PrivacyEpoch.objects.get(owner_id=owner_id).reason == "memory_forgotten"
    assert result.redacted["companion.call_snapshots"] == 1  # the copy in the frozen background is gone too
    redacted = CallSnapshot.objects.get(pk=snap.pk)
    assert "修车床的手艺" not in str(redacted.background) + redacted.opening and "[forgotten]" in redacted.opening
    prompt = call_snapshot.call_prompt(owner_id, sim.device.id)
    assert prompt is not None and "DATA withdrawn" in prompt and "修车床" not in prompt and "## DATA: the owner's interests" not in prompt
    rebuilt = call_snapshot.prepare(call, now=AT + timedelta(seconds=30))
    assert rebuilt.state == "rebuilt" and rebuilt.snapshot.epoch == before + 1
    assert [i["text"] for i in rebuilt.snapshot.background["interests"]] == ["下象棋"]
    assert "DATA withdrawn" not in (call_snapshot.call_prompt(owner_id, sim.device.id) or "")


@pytest.mark.django_db
def test_editing_a_fact_or_erasing_the_timeline_moves_the_epoch_and_creating_one_does_not(owner: Any) -> None:
    owner_id = owner.pk
    aid = believe(owner_id, "interest.craft", "修车床", "i")
    assert privacy_epoch.current(owner_id) == 0  # a new fact invalidates nothing
    assertions.commit(CommitRequest(owner_id, "e", "interest.craft", {"text": "修磨床"}, 1, assertion_id=aid))
    assert privacy_epoch.current(owner_id) == 1
    assert PrivacyEpoch.objects.get(owner_id=owner_id).reason == "memory_edited"
    append_entry(owner_id=owner_id, kind="utterance", text="别聊我老伴 MARK-ERASE")
    erasure.erase(owner_id, erasure.preview(owner_id, {"text": "MARK-ERASE"}).token)
    assert privacy_epoch.current(owner_id) == 2 and PrivacyEpoch.objects.get(owner_id=owner_id).reason == "timeline_erased"


@pytest.mark.django_db
def test_another_owners_data_never_reaches_a_snapshot(make_device: Any) -> None:
    sim = make_device()
    owner_id = sim.device.owner_id
    other = User.objects.create_user("neighbour", password="x" * 12)
    believe(other.pk, "interest.secret", "邻居的私事", "o1")
    believe(other.pk, "profile.address", "李阿姨", "o2")
    believe(owner_id, "interest.craft", "修车床", "i")
    mine = call_snapshot.prepare(open_call(owner_id, sim.device, "c1"), now=AT).snapshot
    theirs = call_snapshot.prepare(open_call(other.pk, sim.device, "c2"), now=AT).snapshot
    assert "邻居的私事" not in str(mine.background) + mine.opening and "李阿姨" not in str(mine.background) + mine.opening
    assert "修车床" not in str(theirs.background) + theirs.opening and theirs.background["address"] == "李阿姨"
    assert mine.persona_version.owner_id == owner_id and theirs.persona_version.owner_id == other.pk
    other_aid = assertions.query(other.pk, prefix="interest.")[0]["id"]
    assertions.forget(other.pk, other_aid, request_id="f")  # their forget moves their epoch only
    assert privacy_epoch.current(other.pk) == 1 and privacy_epoch.current(owner_id) == 0
    assert call_snapshot.prepare(open_call(owner_id, sim.device, "c1"), now=AT).state == "reused"


# --- continuity --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_continuity_off_keeps_the_persona_and_an_opening_and_moves_the_epoch(make_device: Any) -> None:
    sim = make_device()
    owner_id = sim.device.owner_id
    believe(owner_id, "profile.address", "王师傅", "a")
    believe(owner_id, "interest.craft", "修车床", "i")
    with pytest.raises(YimiError) as bad:
        privacy_epoch.set_continuity(owner_id, "no")
    assert bad.value.code == "invalid_request" and privacy_epoch.continuity_enabled(owner_id)
    call = open_call(owner_id, sim.device, "c1")
    assert call_snapshot.prepare(call, now=AT).snapshot.continuity
    assert privacy_epoch.set_continuity(owner_id, False) and not privacy_epoch.set_continuity(owner_id, False)
    assert privacy_epoch.current(owner_id) == 1 and PrivacyEpoch.objects.get(owner_id=owner_id).reason == "continuity_off"
    off = call_snapshot.prepare(call, now=AT)
    assert off.state == "rebuilt" and not off.snapshot.continuity and off.frame()["continuity"] is False
    assert off.snapshot.background["interests"] == [] and off.snapshot.background["address"] == "王师傅"
    assert off.snapshot.opening.startswith("王师傅，中午好。") and "修车床" not in off.snapshot.opening
    assert call_snapshot.call_prompt(owner_id, sim.device.id).startswith("You are Yimi (依米).")
    assert privacy_epoch.set_continuity(owner_id, True) and privacy_epoch.current(owner_id) == 1  # on again: no move


# --- the real voice socket ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_call_start_on_the_voice_socket_says_which_snapshot_the_call_got(voice_catalog: dict[str, Any], make_device: Any) -> None:
    sim = await db_async(make_device)()
    owner_id = sim.device.owner_id
    await db_async(believe)(owner_id, "interest.craft", "修车床", "i")
    comm = await open_voice(sim)
    await start(comm)
    await comm.send_json_to({"type": "call.start", "id": "s1", "call_id": "call-9"})
    started = await receive_until(comm, "call.started", "error")
    assert started["type"] == "call.started" and started["call_id"] == "call-9", started
    snapshot = started["snapshot"]
    assert snapshot["state"] == "built" and snapshot["persona"] == {"version": 1, "name": "Yimi (依米)"} and snapshot["error"] is None
    assert "修车床" in snapshot["opening"]
    await comm.send_json_to({"type": "call.start", "id": "s1-again", "call_id": "call-9"})  # the answer was lost: asked again
    assert (await receive_until(comm, "call.started", "error"))["snapshot"] == {**snapshot, "state": "reused"}
    await comm.send_json_to({"type": "call.start", "id": "s1-other", "call_id": "call-10"})
    assert (await receive_until(comm, "call.started", "error"))["code"] == "call_in_progress"

    # The device reconnects before the server noticed the old socket dropped, and starts the
    # same call again: the frozen snapshot comes back.
    again = await open_voice(sim)
    await start(again)
    await again.send_json_to({"type": "call.start", "id": "s2", "call_id": "call-9"})
    reused = await receive_until(again, "call.started", "error")
    assert reused["snapshot"] == {**snapshot, "state": "reused"}
    assert await db_async(CallSnapshot.objects.count)() == 1
    await again.send_json_to({"type": "call.end", "call_id": "call-9"})
    await receive_until(again, "call.ended")
    await again.disconnect()
    await comm.disconnect()
