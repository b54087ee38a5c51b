"""Erasing timeline entries (the ``erasure`` pack, ``memory.timeline.erasure``): the preview is
exactly what is erased, a set that changed after the preview is refused, the entries'
embeddings and image originals go with them, the copies the platform kept are redacted
(every table scanned), and other owners' entries are untouched."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from accounts.models import User
from brain.services import accept_utterance
from capabilities.contract import run_contract
from memory.models import MemoryReceipt, TimelineEmbedding, TimelineEntry
from memory.personal import images as image_store
from memory.timeline import erasure
from memory.timeline.embeddings import HashingEmbedder, index_timeline
from memory.timeline.entries import append_entry
from tests.conftest import internal_client, new_client_id, pack_capability
from tests.devices.test_images import picture
from tests.memory.test_memory_forgetting import places_holding
from tests.schedules.test_watches import report_text
from yimi_project.errors import YimiError

CAP = "X-Yimi-Call-Capability"
PACK = Path(__file__).resolve().parents[2] / "packs" / "erasure"
MARK = "quartz-heron-5521"
LINES = [f"{MARK} 明天下午三点去看牙医", f"{MARK} 把银行卡密码改成新的那个", f"{MARK} 给小林的礼物藏在书柜后面"]


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, settings: Any) -> Path:
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    return settings.DATA_DIR


def entries(owner: Any, texts: list[str]) -> list[TimelineEntry]:
    return [append_entry(owner_id=owner.pk, kind="utterance", text=t, scope="owner") for t in texts]


def other_owner_with(texts: list[str]) -> tuple[Any, list[TimelineEntry]]:
    """A second account holding the same texts (the platform is single-owner, but its
    tables are keyed by owner: nothing of theirs may move)."""
    other = User.objects.create_user("someone-else", password="x")
    made = entries(other, texts)
    index_timeline(other.pk, HashingEmbedder())
    return other, made


# --- contract -------------------------------------------------------------------------------------


def test_the_erasure_contract_passes_on_the_fake() -> None:
    report = run_contract(PACK, fake=True)
    assert report.passed, report_text(report)
    assert len(report.cases) == 4


@pytest.mark.django_db(transaction=True)
def test_the_erasure_contract_passes_on_the_real_server_against_the_platform(internal_listener: Any, owner: Any) -> None:
    report = run_contract(PACK, fake=False, owner_id=owner.pk)
    assert report.passed, report_text(report)
    assert report.skipped == ["the fake's entries are previewed, erased exactly, and read back"]


# --- the service ------------------------------------------------------------------------------------


def test_a_set_that_changed_after_the_preview_is_refused_and_nothing_is_erased(owner: Any) -> None:
    made = entries(owner, LINES[:2])
    seen = erasure.preview(owner.pk, {"text": MARK})
    assert [e["seq"] for e in seen.entries] == [e.seq for e in made]
    late = entries(owner, LINES[2:])[0]  # a new matching line after the preview
    with pytest.raises(YimiError) as refused:
        erasure.erase(owner.pk, seen.token)
    assert refused.value.code == "erasure_changed"
    assert list(TimelineEntry.objects.filter(owner=owner).order_by("seq").values_list("text", flat=True)) == LINES
    assert not MemoryReceipt.objects.filter(kind="erase").exists()
    # an entry erased since (by another erasure) changes the set too
    again = erasure.preview(owner.pk, {"text": MARK})
    erasure.erase(owner.pk, erasure.preview(owner.pk, {"seqs": [late.seq]}).token)
    with pytest.raises(YimiError) as changed:
        erasure.erase(owner.pk, again.token)
    assert changed.value.code == "erasure_changed"


def test_criteria_combine_and_bad_input_changes_nothing(owner: Any) -> None:
    made = entries(owner, [*LINES, "别的事情"])
    start = made[0].created_at
    by_range = erasure.preview(owner.pk, {"after": (start - timedelta(seconds=1)).isoformat(), "before": (timezone.now() + timedelta(seconds=1)).isoformat()})
    assert len(by_range.entries) == 4
    both = erasure.preview(owner.pk, {"seqs": [made[0].seq, made[3].seq], "text": MARK})
    assert [e["seq"] for e in both.entries] == [made[0].seq]
    for bad in ({}, {"text": "x"}, {"seqs": [0]}, {"seqs": "1"}, {"after": "yesterday"}, {"after": "2026-01-01T00:00:00"},
                {"after": "2026-01-02T00:00:00+00:00", "before": "2026-01-01T00:00:00+00:00"}):
        with pytest.raises(YimiError) as refused:
            erasure.preview(owner.pk, bad)
        assert refused.value.code == "invalid_request", bad
    for token in ("", "forged", by_range.token[:-2] + "xx"):
        with pytest.raises(YimiError):
            erasure.erase(owner.pk, token)
    assert TimelineEntry.objects.filter(owner=owner, erased_at__isnull=False).count() == 0


def test_more_than_the_limit_is_refused(owner: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(erasure, "MAX_ENTRIES", 2)
    entries(owner, LINES)
    with pytest.raises(YimiError) as refused:
        erasure.preview(owner.pk, {"text": MARK})
    assert refused.value.code == "erasure_too_large"


def test_another_owners_token_is_refused(owner: Any) -> None:
    entries(owner, LINES[:1])
    other, theirs = other_owner_with(LINES[:1])
    token = erasure.preview(other.pk, {"text": MARK}).token
    with pytest.raises(YimiError) as refused:
        erasure.erase(owner.pk, token)
    assert refused.value.code == "forbidden"
    assert TimelineEntry.objects.get(id=theirs[0].id).text == LINES[0]


@pytest.mark.django_db(transaction=True)
def test_the_internal_erase_needs_a_delete_call_on_the_same_token(owner: Any) -> None:
    entries(owner, LINES[:1])
    token = erasure.preview(owner.pk, {"text": MARK}).token
    as_observe = pack_capability(owner.pk, pack="erasure", category="observe", apis=["erasure"], preview_token=token)
    refused = internal_client(**{CAP: as_observe}).post(
        "/internal/erasure/erase/", {"preview_token": token}, content_type="application/json")
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")
    assert "decided as 'observe'" in refused.json()["error"]["message"]
    other_token = pack_capability(owner.pk, pack="erasure", category="delete", apis=["erasure"], preview_token="another")
    refused = internal_client(**{CAP: other_token}).post(
        "/internal/erasure/erase/", {"preview_token": token}, content_type="application/json")
    assert refused.status_code == 403
    no_api = pack_capability(owner.pk, pack="memory", category="delete", apis=["memory"], preview_token=token)
    refused = internal_client(**{CAP: no_api}).post(
        "/internal/erasure/erase/", {"preview_token": token}, content_type="application/json")
    assert refused.status_code == 403
    assert TimelineEntry.objects.get(owner=owner).text == LINES[0]
    allowed = pack_capability(owner.pk, pack="erasure", category="delete", apis=["erasure"], preview_token=token)
    done = internal_client(**{CAP: allowed}).post(
        "/internal/erasure/erase/", {"preview_token": token}, content_type="application/json")
    assert done.status_code == 200 and len(done.json()["entries"]) == 1


# --- through the gateway, checked against every table ------------------------------------------


@pytest.fixture
def platform(request: Any, settings: Any) -> Any:
    return request.getfixturevalue("internal_listener")


@pytest.mark.django_db(transaction=True)
def test_the_preview_is_exactly_what_is_erased_with_embeddings_originals_and_copies(
    platform: Any, make_device: Any, data_dir: Path
) -> None:
    from brain import agents
    from capabilities.client import call_tool
    from capabilities.mcp_host import runtime

    runtime.reset_for_tests()
    try:
        phone = make_device()
        owner_id = phone.device.owner_id
        run_id = str(accept_utterance(phone.device, new_client_id(), LINES[0]).run_id)
        made = [TimelineEntry.objects.get(owner_id=owner_id, text=LINES[0]), *entries(phone.device.owner, LINES[1:])]
        keep = entries(phone.device.owner, ["这句话不删"])[0]
        stored = image_store.store_upload(device=phone.device, scope="owner", data=picture())
        image = image_store.attach_image(device=phone.device, scope="owner", image_id=stored.id, client_id="img-1", captured_at=None).image
        image.refresh_from_db()
        original = data_dir / image.path
        assert original.exists()
        index_timeline(owner_id, HashingEmbedder())
        other, theirs = other_owner_with(LINES)
        agents.delegate(run_id, f"记住主人说的：{LINES[1]}")  # a sub-agent's goal quotes one line
        doomed = [*made, image.entry]
        assert TimelineEmbedding.objects.filter(entry__in=doomed).count() == len(doomed)
        assert "brain_agenttask.goal" in places_holding(LINES[1])

        def tool(name: str, **args: Any) -> Any:
            return asyncio.run(call_tool(run_id, "", name, args))

        seqs = sorted(e.seq for e in doomed)
        preview = tool("erasure__preview", seqs=seqs)
        assert preview.executed and preview.receipt["status"] == "succeeded", preview.model_text
        listed = preview.receipt["content"]["items"]
        assert [i["seq"] for i in listed] == seqs and preview.receipt["content"]["images"] == [str(image.id)]
        token = preview.receipt["content"]["preview_token"]

        erased = tool("erasure__erase", preview_token=token, owner_requested=True)
        assert erased.executed and erased.receipt["status"] == "succeeded", erased.model_text
        content = erased.receipt["content"]
        assert [i["seq"] for i in content["items"]] == [i["seq"] for i in listed]  # exactly the preview
        assert content["images"] == preview.receipt["content"]["images"]
        assert {e["target"] for e in erased.receipt["effects"]} == {f"timeline:{s}" for s in seqs} | {f"image:{image.id}"}

        # the entries are tombstones, their vectors and the original gone
        assert set(TimelineEntry.objects.filter(id__in=[e.id for e in doomed]).values_list("text", flat=True)) == {""}
        assert TimelineEntry.objects.filter(id__in=[e.id for e in doomed], erased_at__isnull=True).count() == 0
        assert TimelineEmbedding.objects.filter(entry__in=doomed).count() == 0
        assert not original.exists() and not original.with_suffix(".json").exists()
        image.refresh_from_db()
        assert (image.state, image.path) == ("purged", "")
        assert index_timeline(owner_id, HashingEmbedder()) == 0  # an erased entry is never embedded again
        # what was not asked for, and the other owner's entries, did not move
        assert TimelineEntry.objects.get(id=keep.id).text == "这句话不删"
        assert list(TimelineEntry.objects.filter(owner=other).order_by("seq").values_list("text", flat=True)) == LINES
        assert TimelineEmbedding.objects.filter(owner=other).count() == len(LINES)

        # no copy of an erased line anywhere (the owner's and the other owner's rows aside)
        holding = places_holding(*LINES)
        assert holding == ["memory_timelineentry.text"], holding
        assert TimelineEntry.objects.filter(text__in=LINES).exclude(owner=other).count() == 0
        assert content["redacted"]["brain.agent_tasks"] == 1 and content["redacted"]["capabilities.receipts"] >= 1

        # the result reads back the same, and a second erase with the token is the same erasure
        again = tool("erasure__result", preview_token=token)
        assert [i["seq"] for i in again.receipt["content"]["items"]] == seqs and again.receipt.get("effects", []) == []
        assert erasure.erase(owner_id, token)["replayed"] is True
    finally:
        runtime.reset_for_tests()
