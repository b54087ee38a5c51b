"""Chinese keyword search on PostgreSQL: the CJK bigram ``tsvector`` column (migration 0005)
is filled at insert and finds exactly what the scan finds, for the owner only."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from memory import recall
from memory.models import TimelineEntry
from memory.timeline.entries import append_entry
from tests.conftest import need

pytestmark = pytest.mark.django_db

TEXTS = [
    "明天去杭州出差，记得订机票",
    "咖啡喝多了睡不着",
    "刚才路过的那家店叫山茶咖啡，招牌是绿色的",
    "山茶花开了，拍张照片",
    "周末和妈妈打电话",
    "The bakery sells coffee and 咖啡豆",
    "订了 flight 去杭州",
    "茶花和山水",  # 茶花 without 山茶
    "杭",  # one character: no bigram
    "nothing Chinese here",
]


@pytest.fixture
def postgres() -> None:
    need(connection.vendor == "postgresql", "the bigram index is PostgreSQL's (set DATABASE_URL)")


def say(owner_id: int, text: str) -> TimelineEntry:
    return append_entry(owner_id=owner_id, kind="utterance", text=text, scope="owner")


def containing(entries: dict[str, TimelineEntry], *needles: str) -> set[int]:
    return {e.id for text, e in entries.items() if any(n.lower() in text.lower() for n in needles)}


def ranked(entries: dict[str, TimelineEntry], query: str) -> list[int]:
    """What the search must answer, computed here: entries containing any of the query's
    terms, by the weighted number of terms contained, newest first on ties."""
    scored = [
        (sum(w for term, w in recall.query_terms(query) if term in text.lower()), e.seq, e.id) for text, e in entries.items()
    ]
    return [entry_id for score, _, entry_id in sorted(scored, reverse=True) if score > 0]


@pytest.fixture
def timeline(owner: Any, postgres: None, django_user_model: Any) -> dict[str, TimelineEntry]:
    other = django_user_model.objects.create_user("neighbour", password="x")
    for text in TEXTS:  # the same words in another owner's timeline
        say(other.pk, text)
    return {text: say(owner.pk, text) for text in TEXTS}


def bigrams(entry_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT text_cjk_bigrams::text FROM memory_timelineentry WHERE id = %s", [entry_id])
        return cursor.fetchone()[0]


def test_the_bigram_column_is_computed_at_insert_and_update(timeline: dict[str, TimelineEntry]) -> None:
    entry = timeline["订了 flight 去杭州"]
    assert bigrams(entry.id) == "'去杭' '杭州' '订了'"  # runs 订了 and 去杭州: Latin and spaces break runs
    assert bigrams(timeline["杭"].id) == "" and bigrams(timeline["nothing Chinese here"].id) == ""
    TimelineEntry.objects.filter(id=entry.id).update(text="改成上海")
    assert bigrams(entry.id) == "'上海' '成上' '改成'"


def test_two_character_chinese_query_finds_exactly_the_entries_containing_it(owner: Any, timeline: dict[str, TimelineEntry]) -> None:
    for query in ("咖啡", "杭州", "山茶", "机票"):
        hits = recall.keyword_search(owner.pk, query)
        assert set(hits) == containing(timeline, query), query
        assert hits == ranked(timeline, query)  # newest first
    assert recall.keyword_search(owner.pk, "雨伞") == []


def test_three_character_chinese_query_ranks_entries_with_both_bigrams_first(owner: Any, timeline: dict[str, TimelineEntry]) -> None:
    hits = recall.keyword_search(owner.pk, "山茶花")
    # Its terms are its bigrams 山茶 and 茶花: every entry containing either, those with both first.
    assert set(hits) == containing(timeline, "山茶", "茶花")
    assert hits[0] == timeline["山茶花开了，拍张照片"].id
    assert hits == ranked(timeline, "山茶花")


def test_mixed_latin_and_chinese_queries_use_both_indexes_and_stay_exact(owner: Any, timeline: dict[str, TimelineEntry]) -> None:
    for query in ("coffee 咖啡", "flight 杭州", "BAKERY 机票"):
        hits = recall.keyword_search(owner.pk, query)
        assert set(hits) == containing(timeline, *query.split()), query
        assert hits == ranked(timeline, query)
    # A term no index holds (one CJK character, a 2-letter word) falls back to the scan.
    assert set(recall.keyword_search(owner.pk, "杭")) == containing(timeline, "杭")
    assert set(recall.keyword_search(owner.pk, "杭 and 咖啡")) == containing(timeline, "杭", "咖啡")


def test_the_index_is_asked_only_when_every_term_has_one(owner: Any, timeline: dict[str, TimelineEntry]) -> None:
    def sql_of(query: str) -> str:
        with CaptureQueriesContext(connection) as queries:
            recall.keyword_search(owner.pk, query)
        return queries.captured_queries[-1]["sql"]

    assert "text_cjk_bigrams @@" in sql_of("咖啡") and "text_cjk_bigrams @@" in sql_of("coffee 咖啡")
    assert "text_cjk_bigrams" not in sql_of("杭")


def test_other_owners_entries_never_appear(owner: Any, timeline: dict[str, TimelineEntry]) -> None:
    mine = {e.id for e in timeline.values()}
    for query in ("咖啡", "山茶花", "coffee 咖啡", "杭", "杭州 flight"):
        hits = recall.keyword_search(owner.pk, query)
        assert hits and set(hits) <= mine, query
