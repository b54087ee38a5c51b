"""The end-of-call summary and topic progress (companion.topics, companion.extractor):
one test per rule of issue 21's "After the call" and "Privacy epoch"."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from companion import privacy_epoch
from companion import topics as topic_state
from companion.extractor import EXTRACTOR_VERSION, Turn, extract
from companion.models import CallSummary, TopicState
from memory import source_changes
from tests.support.companion_support import TranscribedCall, second_owner_device, states, talk

pytestmark = pytest.mark.django_db


@pytest.fixture
def phone(make_device: Any) -> Any:
    return make_device().device


def test_yimis_own_question_is_never_an_answer() -> None:
    turns = [Turn("yimi", "您老伴以前在哪个厂上班？"), Turn("yimi", "您老伴喜欢听戏吗？"), Turn("owner", "今天天气不错", 1)]
    assert extract(turns, {}).changes == []  # Yimi named three topics; the owner answered none of them


def test_every_state_change_cites_an_owner_utterance(phone: Any) -> None:
    call = talk(phone, "c1", [("owner", "我以前修车床"), ("yimi", "车床调准了活才稳。您在哪个厂？"), ("owner", "红星机床厂"),
                              ("guest", "别聊老伴了"), ("yimi", "好的。")])
    rows = list(TopicState.objects.order_by("position"))
    owner_entries = {e.id for e in call.entries if e.scope == "owner"}
    assert rows and all(r.source_entry_id in owner_entries and r.source_call_id == call.call.pk for r in rows)
    assert all(r.quote == r.source_entry.text and r.extractor_version == EXTRACTOR_VERSION for r in rows)
    assert "family.spouse" not in states(phone.owner_id)  # a guest's words change nothing
    factory = TopicState.objects.get(topic_key="work.factory")
    assert (factory.state, factory.quote, factory.last_question) == ("answered", "红星机床厂", "您在哪个厂？")


def test_two_short_replies_in_a_row_make_a_cooldown_candidate_not_a_refusal(phone: Any) -> None:
    talk(phone, "c1", [("owner", "我喜欢听戏"), ("yimi", "您爱听京剧还是越剧？"), ("owner", "嗯"), ("yimi", "京剧里您最喜欢哪出戏？"), ("owner", "嗯。")])
    row = TopicState.objects.get(state="cooldown")
    assert (row.topic_key, row.change, row.quote) == ("music.opera", "short_replies", "嗯。")
    assert row.cooldown_until is not None and row.cooldown_until > timezone.now()
    assert not TopicState.objects.filter(state="refused").exists()
    assert CallSummary.objects.get().stats["short_reply_loops"] == 1


def test_one_short_reply_changes_nothing(phone: Any) -> None:
    talk(phone, "c1", [("owner", "嗯"), ("yimi", "那我讲个小故事。"), ("owner", "好啊，讲讲看")])
    assert not TopicState.objects.filter(state="cooldown").exists()


def test_an_explicit_refusal_is_refused_and_reopens_only_when_the_owner_brings_it_up(phone: Any) -> None:
    talk(phone, "c1", [("owner", "别聊我老伴")])
    assert states(phone.owner_id)["family.spouse"] == ("refused", "别聊我老伴")
    second = talk(phone, "c2", [("owner", "今天挺好"), ("yimi", "您老伴身体还好吗？"), ("owner", "还行吧，挺好的")])
    assert states(phone.owner_id)["family.spouse"][0] == "refused"  # Yimi raising it is no reopening, and is counted
    assert CallSummary.objects.get(call=second.call).stats["refused_raised"] == 1
    third = talk(phone, "c3", [("owner", "我老伴年轻时候可会唱戏了")])
    row = TopicState.objects.get(topic_key="family.spouse", source_call=third.call)
    assert (row.state, row.change, row.source_entry_id) == ("answered", "reopened", third.entries[0].id)


def test_tiredness_ends_without_refusing_anything(phone: Any) -> None:
    talk(phone, "c1", [("owner", "我以前修车床"), ("yimi", "最难的是找毛病吗？"), ("owner", "累了，不聊了")])
    assert states(phone.owner_id) == {"craft.lathe": ("answered", "我以前修车床")}
    assert CallSummary.objects.get().stats["ended_by_owner"] is True


def test_a_finished_story_is_done_and_never_a_thread(phone: Any) -> None:
    talk(phone, "c1", [("owner", "我以前修车床"), ("yimi", "那我讲个老车床的故事，讲完了您说说。"), ("owner", "讲完了？挺好听，车床那段我听完了")])
    assert states(phone.owner_id)["craft.lathe"][0] == "done"
    continuity = topic_state.continuity_for(phone.owner_id)
    assert continuity["resume"] is None and continuity["resume_thread"] == "" and continuity["finished"] == ["修车床"]


def test_a_corrected_detail_the_newest_statement_wins_and_keeps_its_source(phone: Any) -> None:
    first = talk(phone, "c1", [("owner", "我在红星机床厂干了三十年")])
    second = talk(phone, "c2", [("owner", "不对，我记错了，是东风机床厂")])
    assert states(phone.owner_id)["work.factory"] == ("answered", "不对，我记错了，是东风机床厂")
    rows = list(TopicState.objects.filter(topic_key="work.factory").order_by("created_at", "id"))
    assert [(r.change, r.source_entry_id) for r in rows] == [("answered", first.entries[0].id), ("correction", second.entries[0].id)]
    known = topic_state.continuity_for(phone.owner_id)["known_details"]
    assert [(d["topic_key"], d["quote"], d["source_entry"]) for d in known] == [("work.factory", "不对，我记错了，是东风机床厂", second.entries[0].id)]


def test_the_job_is_idempotent_on_call_transcript_and_extractor_version(phone: Any) -> None:
    call = talk(phone, "c1", [("owner", "我以前修车床")])
    first = CallSummary.objects.get()
    assert call.summarize().status == "duplicate" and CallSummary.objects.count() == 1 and TopicState.objects.count() == 1
    call.yimi("车床调准了，活才稳。")  # a reply stored after the first job: a new transcript version
    outcome = call.summarize()
    assert outcome.status == "written"
    first.refresh_from_db()
    assert first.invalidated_reason == "superseded" and first.transcript_version != CallSummary.objects.get(id=outcome.summary_id).transcript_version
    assert TopicState.objects.filter(invalidated_at=None).count() == 1


def test_a_call_still_open_is_not_summarized(phone: Any) -> None:
    call = TranscribedCall(phone, "c1")
    call.owner("我以前修车床")
    assert topic_state.summarize_call(call.call.pk).status == "call_open" and not CallSummary.objects.exists()


def test_a_job_started_under_an_older_epoch_writes_nothing(phone: Any) -> None:
    call = TranscribedCall(phone, "c1")
    call.owner("我以前修车床")
    call.hang_up()
    prepared = topic_state.prepare(call.call.pk)
    assert isinstance(prepared, topic_state.Prepared)
    privacy_epoch.bump(phone.owner_id, "memory_forgotten")
    assert topic_state.write(prepared).status == "stale_epoch"
    assert not CallSummary.objects.exists() and not TopicState.objects.exists()
    assert topic_state.summarize_call(call.call.pk).status == "written"  # a new job, under the new epoch
    assert CallSummary.objects.get().epoch == privacy_epoch.current(phone.owner_id)


def test_erasing_a_quoted_utterance_invalidates_its_rows_and_summary_in_the_bump(phone: Any) -> None:
    kept = talk(phone, "c1", [("owner", "我喜欢喝茶")])
    gone = talk(phone, "c2", [("owner", "我以前修车床")])
    change = source_changes.SourceChange(phone.owner_id, source_changes.ERASED, entry_ids=(gone.entries[0].id,))
    privacy_epoch.bump(phone.owner_id, change.reason, change=change)
    assert set(states(phone.owner_id)) == {"drink.tea"}
    assert CallSummary.objects.get(call=gone.call).invalidated_reason == source_changes.ERASED
    assert CallSummary.objects.get(call=kept.call).invalidated_at is None
    assert "车床" not in topic_state.continuity_for(phone.owner_id)["latest_summary"]


def test_facts_come_from_the_current_l3_version_once_and_an_edit_invalidates_the_summary(phone: Any) -> None:
    from memory.assertions import store as assertions
    from memory.assertions.store import CommitRequest

    call = TranscribedCall(phone, "c1")
    said = call.owner("我在红星机床厂干了三十年")
    fact = assertions.commit(CommitRequest(owner_id=phone.owner_id, request_id=uuid.uuid4().hex, predicate="work.history",
                                           payload={"text": "在红星机床厂干了三十年"}, expected_version=0, evidence=(said.seq,)))
    assert call.summarize().status == "written"
    again = TranscribedCall(phone, "c2")
    again_said = again.owner("红星机床厂那会儿真忙")
    assertions.commit(CommitRequest(owner_id=phone.owner_id, request_id=uuid.uuid4().hex, predicate="work.history",
                                    payload={"text": "在红星机床厂干了三十年"}, expected_version=1, evidence=(again_said.seq,),
                                    assertion_id=uuid.UUID(fact.assertion_id)))
    # The owner's edit above (a new version) invalidated the first summary at once (it cited version 1).
    assert CallSummary.objects.get(call=call.call).invalidated_reason == source_changes.EDITED
    assert again.summarize().status == "written"
    facts = topic_state.continuity_for(phone.owner_id)["facts"]
    assert [(f["assertion_id"], f["version"]) for f in facts] == [(fact.assertion_id, 2)]


def test_turning_continuity_off_invalidates_everything_and_stops_new_summaries(phone: Any) -> None:
    talk(phone, "c1", [("owner", "别聊我老伴"), ("owner", "我以前修车床")])
    privacy_epoch.set_continuity(phone.owner_id, False)
    assert not TopicState.objects.filter(invalidated_at=None).exists() and not CallSummary.objects.filter(invalidated_at=None).exists()
    empty = topic_state.continuity_for(phone.owner_id)
    assert (empty["latest_summary"], empty["resume_thread"], empty["avoid_topics"]) == ("", "", [])
    call = TranscribedCall(phone, "c2")
    call.owner("我喜欢喝茶")
    assert call.summarize().status == "continuity_off" and CallSummary.objects.filter(call=call.call).count() == 0


def test_another_owners_progress_never_reaches_continuity(phone: Any) -> None:
    talk(phone, "c1", [("owner", "别聊我老伴"), ("owner", "我以前修车床")])
    other = second_owner_device()
    talk(other, "c1", [("owner", "我喜欢喝茶")])
    mine, theirs = topic_state.continuity_for(phone.owner_id), topic_state.continuity_for(other.owner_id)
    assert mine["avoid_topics"] == ["老伴"] and "车床" in mine["resume_thread"] and "茶" not in str(mine)
    assert theirs["avoid_topics"] == [] and "喝茶" in theirs["resume_thread"] and "车床" not in str(theirs) and "老伴" not in str(theirs)


def test_a_cooldown_expires(phone: Any) -> None:
    talk(phone, "c1", [("owner", "我喜欢听戏"), ("yimi", "您爱听哪出？"), ("owner", "嗯"), ("owner", "嗯")])
    assert topic_state.continuity_for(phone.owner_id)["cooling"] == ["听戏"]
    later = timezone.now() + timedelta(days=3)
    assert topic_state.continuity_for(phone.owner_id, now=later)["cooling"] == []


# --- call events and the companion report -------------------------------------------------------


def test_first_audio_latency_and_counts_per_owner_on_an_injected_clock(phone: Any) -> None:
    from django.core.management import call_command

    from companion import events as call_events

    clock = {"now": timezone.now()}
    buffer = call_events.EventBuffer(clock=lambda: clock["now"], background=False)
    for i, latency_ms in enumerate([100, 200, 300, 400, 1000]):
        call = TranscribedCall(phone, f"timed-{i}").call
        buffer.record(call.pk, call.owner_id, "start")
        clock["now"] += timedelta(milliseconds=latency_ms)
        buffer.record(call.pk, call.owner_id, "first_audio", via="ack")
        buffer.record(call.pk, call.owner_id, "first_audio", via="ack")  # only the first counts
        clock["now"] += timedelta(seconds=5)
    failed = TranscribedCall(phone, "failed").call
    buffer.record(failed.pk, failed.owner_id, "start")
    buffer.record(failed.pk, failed.owner_id, "snapshot_failed")
    buffer.record(failed.pk, failed.owner_id, "barge_in")
    assert buffer.flush() == 18 and buffer.flush() == 0
    talk(phone, "loops", [("owner", "我喜欢听戏"), ("owner", "嗯"), ("owner", "嗯"), ("yimi", "哪出戏？"), ("owner", "好"), ("owner", "嗯")])
    [row] = call_events.report(owner_id=phone.owner_id)
    assert (row["calls"], row["first_audio_n"], row["first_audio_p50_ms"], row["first_audio_p95_ms"]) == (6, 5, 300, 1000)
    assert (row["snapshot_failures"], row["barge_ins"], row["short_reply_loops"]) == (1, 1, 2)
    import io

    out = io.StringIO()
    call_command("companion_report", "--json", stdout=out, stderr=io.StringIO())
    assert '"first_audio_p50_ms": 300' in out.getvalue()


def test_an_unknown_event_kind_is_refused() -> None:
    from companion import events as call_events

    with pytest.raises(ValueError):
        call_events.EventBuffer(background=False).record(1, 1, "lunch")
