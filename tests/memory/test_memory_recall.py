"""Recall: layers per question, keyword + vector timeline search fused with RRF, and the
call short context (six sources in parallel, ≤1,200 ms each, ≤2,400 characters)."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from memory import recall, short_context
from memory.assertions import store as assertions
from memory.assertions.store import CommitRequest
from memory.models import TimelineEmbedding
from memory.timeline.embeddings import (
    Embedder,
    HashingEmbedder,
    configured_embedder,
    index_timeline,
    nearest,
    register_embedder,
)
from memory.timeline.entries import append_entry
from tests.support.memory_support import SourceDeadlines, hold_source_deadlines


def say(owner: Any, text: str, kind: str = "utterance") -> Any:
    return append_entry(owner_id=owner.pk, kind=kind, text=text, scope="owner")


def believe(owner: Any, text: str, predicate: str = "preference.food") -> str:
    return assertions.commit(
        CommitRequest(owner_id=owner.pk, request_id=uuid.uuid4().hex, predicate=predicate, payload={"text": text}, expected_version=0)
    ).assertion_id


# --- reciprocal rank fusion --------------------------------------------------------------------


def test_rrf_puts_b_before_a_with_k_60() -> None:
    image, text = ["A", "B", "C"], ["B", "C", "A"]
    fused = recall.rrf([image, text])
    assert [k for k, _ in fused] == ["B", "A", "C"]
    scores = dict(fused)
    assert scores["B"] == pytest.approx(1 / 61 + 1 / 60) and round(scores["B"], 5) == 0.03306
    assert scores["A"] == pytest.approx(1 / 60 + 1 / 62) and round(scores["A"], 5) == 0.0328


def test_rrf_ranks_start_at_zero_with_k_60() -> None:
    assert recall.rrf([["X", "Y"]]) == [("X", 1 / 60), ("Y", 1 / 61)]


def test_rrf_takes_at_most_100_items_per_list() -> None:
    items = [f"e{i}" for i in range(150)]
    fused = dict(recall.rrf([items]))
    assert len(fused) == 100 and "e99" in fused and "e100" not in fused
    assert fused["e99"] == pytest.approx(1 / 159)


def test_rrf_skips_deleted_originals_without_back_filling() -> None:
    items = [f"e{i}" for i in range(101)]
    fused = dict(recall.rrf([items], alive=lambda k: k != "e0"))
    assert "e0" not in fused and "e100" not in fused  # nothing from below the cut moves up
    assert len(fused) == 99 and fused["e1"] == pytest.approx(1 / 61)  # e1 keeps its rank


# --- keyword and vector search -------------------------------------------------------------------


def test_keyword_search_finds_chinese_and_english_entries_best_first(owner: Any) -> None:
    shop = say(owner, "刚才路过的那家店叫「山茶咖啡」，招牌是绿色的")
    say(owner, "今天天气不错")
    half = say(owner, "咖啡喝多了睡不着")
    english = say(owner, "The bakery on Baker Street closes at 6pm")
    hits = recall.keyword_search(owner.pk, "刚才那家店叫什么")
    assert hits[0] == shop.id and half.id not in hits[:1]
    assert recall.keyword_search(owner.pk, "山茶咖啡")[:2] == [shop.id, half.id]
    assert recall.keyword_search(owner.pk, "when does the BAKERY close?") == [english.id]
    assert recall.keyword_search(owner.pk, "100%_") == []  # LIKE wildcards are escaped


def test_keyword_search_uses_the_trigram_index_on_postgresql_and_like_on_sqlite(owner: Any) -> None:
    expected = {"postgresql": "postgresql-trigram", "sqlite": "sqlite-like"}[connection.vendor]
    assert recall.keyword_backend() == expected
    say(owner, "记得买牛奶")
    assert len(recall.keyword_search(owner.pk, "牛奶")) == 1


def test_query_terms_drop_function_words() -> None:
    terms = dict(recall.query_terms("刚才那家店叫什么? What is the name"))
    assert "什么" not in terms and "name" in terms and "the" not in terms
    assert terms["家店"] == 1.0 and terms["那家"] == 0.5


def test_the_test_embedder_implements_the_embedding_interface(settings: Any) -> None:
    embedder = HashingEmbedder()
    assert isinstance(embedder, Embedder)
    a, b, c = embedder.embed(["山茶咖啡的招牌", "山茶咖啡的招牌是绿色", "明天下午三点开会"])
    assert len(a) == embedder.dim == 64 and abs(sum(x * x for x in a) - 1) < 1e-6
    def cos(x: list[float], y: list[float]) -> float:
        return sum(p * q for p, q in zip(x, y))

    assert cos(a, b) > 0.5 > cos(a, c)
    settings.YIMI_EMBEDDING_MODEL = ""
    assert configured_embedder() is None
    register_embedder("catalog-model", lambda: HashingEmbedder(32))
    settings.YIMI_EMBEDDING_MODEL = "catalog-model"
    assert configured_embedder().dim == 32  # type: ignore[union-attr]
    settings.YIMI_EMBEDDING_MODEL = "not-in-the-catalog"
    assert configured_embedder() is None


def test_vector_search_and_keyword_search_are_fused(owner: Any) -> None:
    embedder = HashingEmbedder()
    shop = say(owner, "山茶咖啡的招牌是绿色的")
    say(owner, "明天下午三点开会")
    assert index_timeline(owner.pk, embedder) == 2 and index_timeline(owner.pk, embedder) == 0
    assert nearest(owner.pk, embedder, "山茶咖啡的招牌")[0] == shop.id
    later = say(owner, "山茶咖啡的招牌换成了红色")  # indexed on demand by the search
    hits = recall.search_timeline(owner.pk, "山茶咖啡的招牌", embedder=embedder)
    assert TimelineEmbedding.objects.filter(entry=later).exists()
    top = {h.entry.id: h for h in hits[:2]}
    assert set(top) == {shop.id, later.id}
    assert all(h.lists == ["keyword", "vector"] for h in top.values())
    assert hits[0].score == pytest.approx(1 / 60 + 1 / 60, rel=0.05)


def test_layers_are_chosen_per_question() -> None:
    assert recall.choose_layers("我吃不吃香菜？") == ["l3"]
    assert recall.choose_layers("我昨天说过要买什么？") == ["l3", "timeline"]
    assert recall.choose_layers("刚才那家店叫什么？") == ["l3", "timeline", "l5"]
    assert recall.choose_layers("What did I see in the photo?") == ["l3", "l5"]


def test_recall_reads_the_chosen_layers(owner: Any) -> None:
    believe(owner, "不吃香菜")
    said = say(owner, "我昨天说要买香菜和牛奶")
    result = recall.recall(owner.pk, "我吃不吃香菜？", embedder=None)
    assert result.layers == ["l3"] and [a["payload"]["text"] for a in result.assertions] == ["不吃香菜"] and result.timeline == []
    result = recall.recall(owner.pk, "我昨天说要买什么？")
    assert result.layers == ["l3", "timeline"] and result.timeline[0]["seq"] == said.seq
    result = recall.recall(owner.pk, "牛奶")  # nothing in L3: the timeline is searched too
    assert result.layers == ["l3", "timeline"] and result.timeline[0]["seq"] == said.seq
    result = recall.recall(owner.pk, "刚才看到的那家店叫什么")
    assert "l5" in result.unavailable


# --- the call short context ----------------------------------------------------------------------


@pytest.fixture
def deadlines(monkeypatch: Any) -> SourceDeadlines:
    """No source's time runs out unless the test says so (a busy machine drops none)."""
    return hold_source_deadlines(monkeypatch)


def fill(owner: Any) -> None:
    from memory.assertions import preferences

    owner.time_zone = "Asia/Shanghai"
    owner.save(update_fields=["time_zone"])
    for i in range(3):
        assertions.commit(CommitRequest(owner_id=owner.pk, request_id=f"u{i}", predicate="core_profile.entry",
                                        payload={"text": f"关于他的要点 {i} " + "资料" * 200, "doc": "user"}, expected_version=0))
    assertions.commit(CommitRequest(owner_id=owner.pk, request_id="m", predicate="core_profile.entry",
                                    payload={"text": "笔记：每周五和家人视频", "doc": "memory"}, expected_version=0))
    believe(owner, "不吃香菜")
    believe(owner, "对青霉素过敏", predicate="health.allergy")
    preferences.set_preferences(owner.pk, "说话简短", expected_version=0, request_id="p")
    for i in range(30):
        say(owner, f"第 {i} 句话 " + "聊天" * 50)


@pytest.mark.django_db(transaction=True)
def test_short_context_reads_six_sources_in_at_most_2400_characters(owner: Any, settings: Any, tmp_path: Path, deadlines: SourceDeadlines) -> None:
    settings.DATA_DIR = tmp_path
    fill(owner)
    context = short_context.call_short_context(owner.pk)
    assert [name for name, _ in short_context.SOURCES] == ["time_zone", "profile", "health", "assertions", "notes", "recent_timeline"]
    assert len(context.text) <= 2400 and context.timed_out == [] and context.failed == []
    assert context.text.startswith("[time_zone]\nAsia/Shanghai, local time ")
    assert "对青霉素过敏" in context.text and "关于他的要点 0" in context.text
    assert context.included[:3] == ["time_zone", "profile", "health"]


@pytest.mark.django_db(transaction=True)
def test_short_context_leaves_out_a_source_that_takes_longer_than_1200_ms(owner: Any, settings: Any, tmp_path: Path, deadlines: SourceDeadlines) -> None:
    """Each source is given 1,200 ms; the one whose time runs out before it answers is left
    out and not waited for, the others (read in parallel) are used."""
    settings.DATA_DIR = tmp_path
    believe(owner, "不吃香菜")
    slow_started, release = threading.Event(), threading.Event()

    def slow_health(owner_id: int) -> str:
        slow_started.set()
        release.wait(60)  # still running when its time is up, and after the call returned
        return "late health data"

    def in_time(owner_id: int) -> str:
        # answers only while the slow source is running: the sources are read in parallel
        if not slow_started.wait(60):
            raise RuntimeError("the sources were read one after another")
        return "arrived in time"

    sources = [*((n, f) for n, f in short_context.SOURCES if n not in ("health", "notes")), ("notes", in_time), ("health", slow_health)]
    deadlines.passes["health"] = slow_started  # health's time is up once it runs; nobody else's is
    try:
        context = short_context.call_short_context(owner.pk, sources=sources)  # returns while health still runs
    finally:
        release.set()
    assert context.timed_out == ["health"] and context.failed == [] and "late health data" not in context.text
    assert "[notes]\narrived in time" in context.text and "不吃香菜" in context.text
    assert sorted(deadlines.asked) == sorted((name, 1.2) for name, _ in sources)


@pytest.mark.django_db(transaction=True)
def test_short_context_leaves_out_a_failing_source(owner: Any, settings: Any, tmp_path: Path, deadlines: SourceDeadlines) -> None:
    settings.DATA_DIR = tmp_path

    def broken(owner_id: int) -> str:
        raise RuntimeError("health service down")

    context = short_context.call_short_context(owner.pk, sources=[("time_zone", short_context.time_zone_source), ("health", broken)])
    assert context.failed == ["health"] and context.included == ["time_zone"]


def test_vectors_written_by_another_process_are_picked_up(owner: Any) -> None:
    from memory.timeline.embeddings import to_bytes

    embedder = HashingEmbedder()
    say(owner, "明天下午三点开会")
    index_timeline(owner.pk, embedder)
    assert len(nearest(owner.pk, embedder, "开会")) == 1  # loads and caches the vectors
    other = say(owner, "山茶咖啡的招牌是绿色的")
    (vector,) = embedder.embed([other.text])  # as a worker process would store it
    TimelineEmbedding.objects.create(entry=other, owner=owner, model=embedder.name, dim=embedder.dim, vector=to_bytes(vector))
    assert nearest(owner.pk, embedder, "山茶咖啡的招牌")[0] == other.id
    TimelineEmbedding.objects.filter(entry=other).delete()  # and removed again: a full reload
    assert other.id not in nearest(owner.pk, embedder, "山茶咖啡的招牌")
