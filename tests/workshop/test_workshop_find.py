"""capability_find (flow F4): installed packs, the local skill index, the local MCP index.

A source that cannot be searched is reported and the search carries on; ranking is by
weighted term matches, each result saying why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from workshop.find import capability_find, terms
from yimi_project.errors import YimiError

EXAMPLES = Path(__file__).resolve().parents[2] / "workshop" / "indexes"


@pytest.fixture
def indexes(settings: Any) -> Any:
    settings.YIMI_WORKSHOP_SKILL_INDEX = EXAMPLES / "skills.example.json"
    settings.YIMI_WORKSHOP_MCP_INDEX = EXAMPLES / "mcp.example.json"
    return settings


def source(result: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in result["sources"] if s["name"] == name)


def test_a_missing_index_is_reported_and_the_other_sources_are_searched(indexes: Any, tmp_path: Path) -> None:
    indexes.YIMI_WORKSHOP_MCP_INDEX = tmp_path / "absent.json"
    result = capability_find("convert kilometres to miles")
    assert source(result, "mcp")["status"] == "unavailable"
    assert "absent.json" in source(result, "mcp")["error"]
    assert source(result, "skills") == {"name": "skills", "status": "ok", "error": None, "entries": 2, "skipped": 0}
    assert source(result, "packs")["status"] == "ok" and source(result, "packs")["entries"] > 0
    top = result["results"][0]
    assert (top["source"], top["id"], top["action"]) == ("skills", "unit-converter", "reuse")


def test_a_corrupt_index_is_reported_as_invalid_and_the_search_carries_on(indexes: Any, tmp_path: Path) -> None:
    broken = tmp_path / "skills.json"
    broken.write_text('{"format": 1, "entries": [')
    indexes.YIMI_WORKSHOP_SKILL_INDEX = broken
    result = capability_find("weather forecast")
    assert source(result, "skills")["status"] == "invalid" and "not valid JSON" in source(result, "skills")["error"]
    assert result["results"][0]["id"] == "io.example/weather"
    wrong_shape = tmp_path / "mcp.json"
    wrong_shape.write_text(json.dumps({"format": 2, "entries": []}))
    indexes.YIMI_WORKSHOP_MCP_INDEX = wrong_shape
    result = capability_find("weather forecast")
    assert source(result, "mcp")["status"] == "invalid" and "format 1" in source(result, "mcp")["error"]
    assert all(r["source"] == "packs" for r in result["results"])


def test_a_broken_entry_is_skipped_and_counted(indexes: Any, tmp_path: Path) -> None:
    index = tmp_path / "mcp.json"
    index.write_text(json.dumps({"format": 1, "entries": [
        {"id": "ok", "name": "Tide tables", "description": "High and low tide times."},
        {"id": "no-description", "name": "Tides"},
        "not an object",
    ]}))
    indexes.YIMI_WORKSHOP_MCP_INDEX = index
    result = capability_find("tide times")
    assert source(result, "mcp") == {"name": "mcp", "status": "ok", "error": None, "entries": 1, "skipped": 2}
    hit = result["results"][0]
    assert (hit["id"], hit["action"]) == ("ok", "reference")  # no local source: cannot be reused


def test_an_installed_pack_is_found_to_be_used_and_the_ranking_says_why(indexes: Any) -> None:
    result = capability_find("track a parcel")
    top = result["results"][0]
    assert (top["source"], top["id"], top["action"], top["enabled"]) == ("packs", "delivery", "use", True)
    assert "delivery__track" in [t["name"] for t in top["tools"]]
    assert "'track' in tools (+2)" in top["why"] and "'parcel' in description (+1)" in top["why"]
    assert top["score"] == sum(int(w.rsplit("+", 1)[1].rstrip(")")) for w in top["why"])
    scores = [r["score"] for r in result["results"]]
    assert scores == sorted(scores, reverse=True)


def test_chinese_queries_match_by_two_character_pieces(indexes: Any) -> None:
    assert terms("明天天气怎么样") == ["明天", "天天", "天气", "气怎", "怎么", "么样"]
    result = capability_find("明天天气怎么样")
    assert result["results"][0]["id"] == "io.example/weather"
    assert "'天气' in keywords (+3)" in result["results"][0]["why"]


def test_a_name_match_outranks_a_description_match(indexes: Any, tmp_path: Path) -> None:
    index = tmp_path / "mcp.json"
    index.write_text(json.dumps({"format": 1, "entries": [
        {"id": "a", "name": "Calendar sync", "description": "Sync with a remote service."},
        {"id": "b", "name": "Notes", "description": "Notes that mention a calendar."},
    ]}))
    indexes.YIMI_WORKSHOP_MCP_INDEX = index
    ids = [r["id"] for r in capability_find("calendar")["results"] if r["source"] == "mcp"]
    assert ids == ["a", "b"]


def test_an_empty_or_oversized_query_is_refused(indexes: Any) -> None:
    for query in ("", "   ", "x" * 201, "the of and"):
        with pytest.raises(YimiError) as refused:
            capability_find(query)
        assert refused.value.code == "invalid_request"
