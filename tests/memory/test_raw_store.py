"""The L5 hot store (memory/archive/raw_store.py; docs/memory.md "Raw store (L5)"): durable originals
with their source, disk admission on bytes AND inodes (an injected statvfs) with one reclaim
and an honest refusal, the owner told first when space is tight, archive batches at 500 ms /
20 frames / 64 KiB on an injected clock, reads from the hot copy or the cold reader, hot copies
deleted only when verified cold, erasure of originals, recall's L5 layer, and the voice socket
archiving before analysis. The ambient analysis bounds are tests/voice/test_ambient.py's."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memory.archive import admission, raw_store
from memory.archive.models import RawObject
from memory.archive.raw_store import ArchiveBatcher, Capture
from memory.models import TimelineEntry
from tests.conftest import db_async, receive_until
from tests.support import voice_support
from tests.voice import test_asr
from tests.voice.test_asr import TranscriptionServer, utterance
from tests.voice.test_voice_session import open_voice, start, stream
from voice import ambient
from yimi_project.errors import YimiError

GiB = 1024**3
T0 = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)


class Disk:
    """An injected statvfs: the free bytes and inodes the admission sees."""

    def __init__(self, free_bytes: int = 100 * GiB, free_inodes: int = 10**7) -> None:
        self.bytes, self.inodes = free_bytes, free_inodes
        self.measured: list[Path] = []

    def __call__(self, path: Path) -> admission.DiskFree:
        self.measured.append(Path(path))
        return admission.DiskFree(bytes=self.bytes, inodes=self.inodes)


@pytest.fixture
def disk(monkeypatch: Any, settings: Any, tmp_path: Path) -> Disk:
    settings.RAW_HOT_ROOT = tmp_path / "raw"
    measured = Disk()
    monkeypatch.setattr(admission, "disk_free", measured)
    return measured


@pytest.fixture(autouse=True)
def hooks() -> Iterator[list[Any]]:
    """Each test starts with no cold-side hook registered (a configured cold store registers
    them at start-up) and gets back what was there; hooks it registers are removed."""
    registries = (raw_store._reclaimers, raw_store._cold_readers, raw_store._cold_verifiers, raw_store._cold_erasers)
    saved = [list(r) for r in registries]
    for registry in registries:
        registry.clear()
    registered: list[Any] = []
    yield registered
    for registry, before in zip(registries, saved, strict=True):
        registry[:] = before


def capture(owner: Any, device: Any = None, channel: str = "glasses") -> Capture:
    return Capture(owner.pk, device.id if device is not None else None, channel, device.name if device is not None else "")


def store(owner: Any, data: bytes = b"\x01\x02" * 800, *, kind: str = "audio", at: datetime = T0, **kwargs: Any) -> RawObject:
    codec = {"audio": raw_store.PCM_CODEC, "image": "image/jpeg", "sensor": "application/json"}[kind]
    return raw_store.store_original(
        kwargs.pop("source", capture(owner)), kind=kind, codec=codec, data=data, started_at=at,
        ended_at=at + timedelta(milliseconds=500), **kwargs,
    )


def hot_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def notices(owner: Any, code: str) -> list[TimelineEntry]:
    return list(TimelineEntry.objects.filter(owner=owner, notice_code=code).order_by("seq"))


# --- storing --------------------------------------------------------------------------------------------


def test_an_original_is_stored_durably_with_its_owner_device_and_channel(owner: Any, make_device: Any, disk: Disk, settings: Any) -> None:
    glasses = make_device("glasses").device
    data = bytes(range(256)) * 10
    obj = store(owner, data, source=capture(owner, glasses, "glasses"), stream="s1", stream_offset=8000)
    assert (obj.owner_id, obj.device_id, obj.channel, obj.kind, obj.codec) == (owner.pk, glasses.id, "glasses", "audio", "pcm_s16le_16k_mono")
    assert obj.size == len(data) and obj.sha256 == hashlib.sha256(data).hexdigest()
    assert (obj.stream, obj.stream_offset, obj.hot_deleted_at, obj.erased_at) == ("s1", 8000, None, None)
    path = Path(settings.RAW_HOT_ROOT) / obj.hot_path
    assert path.read_bytes() == data and not Path(obj.hot_path).is_absolute()
    assert hot_files(Path(settings.RAW_HOT_ROOT)) == [path]  # no temporary file left
    assert disk.measured[-1] == path.parent  # measured where it was written
    original = raw_store.read_original(obj)
    assert (original.data, original.source) == (data, "hot")


def test_bad_input_is_refused_before_anything_is_written(owner: Any, disk: Disk, settings: Any) -> None:
    with pytest.raises(YimiError) as empty:
        store(owner, b"")
    with pytest.raises(YimiError) as backwards:
        raw_store.store_original(capture(owner), kind="audio", codec=raw_store.PCM_CODEC, data=b"x", started_at=T0, ended_at=T0 - timedelta(seconds=1))
    with pytest.raises(YimiError) as kind:
        raw_store.store_original(capture(owner), kind="video", codec="video/mp4", data=b"x", started_at=T0, ended_at=T0)
    assert {empty.value.code, backwards.value.code, kind.value.code} == {"invalid_request"}
    assert not RawObject.objects.exists() and hot_files(Path(settings.RAW_HOT_ROOT)) == [] and disk.measured == []


# --- admission --------------------------------------------------------------------------------------------


def test_admission_refuses_on_bytes_with_an_honest_timeline_entry(owner: Any, make_device: Any, disk: Disk, settings: Any) -> None:
    """Free bytes ≥ 4 GiB + the write: one byte short is refused, nothing is written, the
    timeline says this original was not stored."""
    glasses = make_device("glasses").device
    data = b"\x00" * 16_000
    disk.bytes = 4 * GiB + len(data) - 1
    with pytest.raises(YimiError) as refused:
        store(owner, data, source=capture(owner, glasses))
    assert refused.value.code == "storage_full" and refused.value.details["reason"] == "bytes"
    assert not RawObject.objects.exists() and hot_files(Path(settings.RAW_HOT_ROOT)) == []
    [entry] = notices(owner, "original_not_stored")
    assert refused.value.details["seq"] == entry.seq and entry.device_id == glasses.id and entry.kind == "notice"
    assert "was not stored" in entry.text and "09:30:00" in entry.text and "glasses" in entry.text
    disk.bytes += 1  # exactly the reserve plus the write is enough
    assert store(owner, data).size == len(data)


def test_admission_refuses_on_inodes_even_with_bytes_to_spare(owner: Any, disk: Disk, settings: Any) -> None:
    """Free inodes ≥ 500,000, whatever the free bytes (bytes to spare, too few inodes: refused)."""
    disk.bytes, disk.inodes = 1000 * GiB, 499_999
    with pytest.raises(YimiError) as refused:
        store(owner)
    assert refused.value.code == "storage_full" and refused.value.details["reason"] == "inodes"
    assert "inodes" in notices(owner, "original_not_stored")[0].text
    assert not RawObject.objects.exists() and hot_files(Path(settings.RAW_HOT_ROOT)) == []
    disk.inodes = 500_000
    store(owner)
    assert RawObject.objects.count() == 1


def test_a_refusal_reclaims_once_and_checks_again(owner: Any, disk: Disk, hooks: list[Any]) -> None:
    calls: list[tuple[int, int]] = []

    def reclaimer(directory: Path, missing_bytes: int, missing_inodes: int) -> int:
        calls.append((missing_bytes, missing_inodes))
        disk.inodes += missing_inodes  # deleting verified hot copies freed what was missing
        return 3

    raw_store.register_reclaimer(reclaimer)
    hooks.append(reclaimer)
    disk.inodes = 499_990
    obj = store(owner)
    assert calls == [(0, 10)] and obj.pk is not None and notices(owner, "original_not_stored") == []


def test_a_reclaim_that_frees_too_little_is_still_refused_and_said(owner: Any, disk: Disk, hooks: list[Any]) -> None:
    calls: list[int] = []

    def reclaimer(directory: Path, missing_bytes: int, missing_inodes: int) -> int:
        calls.append(missing_bytes)
        disk.bytes += missing_bytes // 2
        return 1

    def broken(directory: Path, missing_bytes: int, missing_inodes: int) -> int:
        raise OSError("cold store unreachable")

    for fn in (reclaimer, broken):
        raw_store.register_reclaimer(fn)
        hooks.append(fn)
    disk.bytes = 4 * GiB
    with pytest.raises(YimiError) as refused:
        store(owner)
    assert refused.value.code == "storage_full" and len(calls) == 1  # one reclaim, one more check
    assert len(notices(owner, "original_not_stored")) == 1 and not RawObject.objects.exists()


def test_refusals_from_one_device_within_a_minute_share_one_entry(owner: Any, disk: Disk) -> None:
    disk.bytes = GiB
    for _ in range(3):
        with pytest.raises(YimiError) as refused:
            store(owner)
    assert len(notices(owner, "original_not_stored")) == 1 and refused.value.details["seq"] is None


def test_the_owner_is_told_first_when_space_is_tight_once_per_interval(owner: Any, disk: Disk, settings: Any) -> None:
    """Below the warning level (reserve + 2 GiB, or 600,000 inodes) writes are still admitted
    and the owner gets one storage_low notice per RAW_NOTICE_INTERVAL_SECONDS."""
    assert settings.DISK_RESERVE_BYTES + 2 * GiB == settings.DISK_WARN_BYTES and settings.DISK_WARN_INODES == 600_000
    disk.bytes = 6 * GiB + 10**6
    store(owner)
    assert notices(owner, "storage_low") == []
    disk.bytes = 5 * GiB
    store(owner)
    store(owner)
    [notice] = notices(owner, "storage_low")
    assert "nearly full" in notice.text and "5.0 GiB" in notice.text
    disk.bytes, disk.inodes = 100 * GiB, 550_000
    settings.RAW_NOTICE_INTERVAL_SECONDS = 0
    store(owner)
    assert len(notices(owner, "storage_low")) == 2 and RawObject.objects.count() == 4


# --- archive batches ---------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


FRAME = b"\x10\x00" * 160  # 10 ms of 16 kHz 16-bit mono


def test_a_batch_is_written_after_20_frames() -> None:
    clock = Clock()
    batcher = ArchiveBatcher(clock=clock)
    out = [batcher.add(FRAME) for _ in range(19)]
    assert out == [None] * 19 and batcher.pending_bytes == 19 * len(FRAME)
    batch = batcher.add(FRAME)
    assert batch is not None and batch.frames == 20 and batch.data == FRAME * 20
    assert (batch.start_sample, batch.end_sample, batcher.pending_bytes) == (0, 3200, 0)
    second = [batcher.add(FRAME) for _ in range(20)][-1]
    assert second is not None and second.start_sample == 3200  # offsets continue in the stream


def test_a_batch_is_written_at_64_kib() -> None:
    clock = Clock()
    batcher = ArchiveBatcher(clock=clock)
    big = b"\x00" * 16_384
    assert [batcher.add(big) for _ in range(3)] == [None, None, None]
    batch = batcher.add(big)
    assert batch is not None and len(batch.data) == 65_536 and batch.frames == 4
    alone = batcher.add(b"\x00" * 70_000)  # a frame above the limit goes alone
    assert alone is not None and alone.frames == 1


def test_a_batch_is_written_500_ms_after_its_first_frame() -> None:
    clock = Clock()
    batcher = ArchiveBatcher(clock=clock)
    assert batcher.add(FRAME) is None and batcher.seconds_left() == 0.5
    clock.now += 0.499
    assert batcher.add(FRAME) is None and batcher.due() is None
    clock.now += 0.001
    batch = batcher.add(FRAME)
    assert batch is not None and batch.frames == 3
    assert batcher.add(FRAME) is None
    clock.now += 0.5  # no further frame: the timer's due() writes it
    late = batcher.due()
    assert late is not None and late.frames == 1 and batcher.seconds_left() is None and batcher.due() is None
    assert batcher.flush() is None


def test_a_batch_is_stored_as_audio_with_its_stream_offset(owner: Any, disk: Disk) -> None:
    clock = Clock()
    batcher = ArchiveBatcher(clock=clock, wall=lambda: T0, start_sample=16_000)
    for _ in range(19):
        batcher.add(FRAME)
    batch = batcher.add(FRAME)
    assert batch is not None
    obj = raw_store.store_batch(capture(owner), batch, stream="sess")
    assert (obj.kind, obj.codec, obj.stream, obj.stream_offset, obj.size) == ("audio", "pcm_s16le_16k_mono", "sess", 16_000, 6400)
    assert obj.ended_at == T0 and obj.started_at == T0 - timedelta(milliseconds=200) and obj.meta == {"frames": 20}


# --- reading, hot copies, erasure ------------------------------------------------------------------------------


def test_a_gone_hot_copy_is_read_from_the_cold_reader_else_unavailable(owner: Any, disk: Disk, hooks: list[Any]) -> None:
    data = b"abc" * 100
    obj = store(owner, data, kind="sensor")
    raw_store.hot_file(obj).unlink()
    with pytest.raises(YimiError) as none:
        raw_store.read_original(obj)
    assert none.value.code == "original_unavailable" and none.value.details["reason"] == "no_cold_store"
    reads: list[int] = []

    def cold(o: RawObject) -> bytes | None:
        reads.append(o.pk)
        return data if o.pk == obj.pk else None

    raw_store.register_cold_reader(cold)
    hooks.append(cold)
    original = raw_store.read_original(obj)
    assert (original.data, original.source, reads) == (data, "cold", [obj.pk])
    other = store(owner, b"zz" * 10, kind="sensor")
    RawObject.objects.filter(pk=other.pk).update(hot_deleted_at=T0)
    other.refresh_from_db()
    with pytest.raises(YimiError) as missing:
        raw_store.read_original(other)
    assert missing.value.details["reason"] == "no_cold_copy"


def test_hot_copies_are_deleted_only_when_their_cold_copy_is_verified(owner: Any, disk: Disk, hooks: list[Any]) -> None:
    a, b = store(owner), store(owner)
    assert raw_store.delete_hot_copies([a.pk, b.pk], reason="retention") == []  # no verifier: nothing goes
    verified = {a.pk}

    def verifier(ids: Any) -> set[int]:
        return {i for i in ids if i in verified}

    raw_store.register_cold_verifier(verifier)
    hooks.append(verifier)
    assert raw_store.delete_hot_copies([a.pk, b.pk], reason="emergency") == [a.pk]
    assert raw_store.delete_hot_copies([a.pk], reason="emergency") == []  # once
    a.refresh_from_db()
    b.refresh_from_db()
    assert a.hot_deleted_at is not None and not raw_store.hot_file(a).exists()
    assert b.hot_deleted_at is None and raw_store.hot_file(b).exists()


@pytest.mark.django_db(transaction=True)
def test_erasing_originals_deletes_hot_copies_and_says_what_remains(owner: Any, disk: Disk, hooks: list[Any]) -> None:
    hot, cold_only, kept = store(owner), store(owner), store(owner)
    RawObject.objects.filter(pk=cold_only.pk).update(hot_deleted_at=T0)
    asked: list[list[int]] = []

    def eraser(owner_id: int, objects: Any) -> dict[str, Any]:
        asked.append(sorted(o.pk for o in objects))
        return {"erased": [o.pk for o in objects], "pending": [cold_only.pk], "packs": ["p1"]}

    result = raw_store.erase_originals(owner.pk, [hot.pk, cold_only.pk, 999_999])
    assert result["erased"] == [hot.pk, cold_only.pk] and result["hot_files_deleted"] == [hot.pk]
    assert result["cold_pending"] == [cold_only.pk] and result["not_found"] == [999_999]  # no eraser: the cold copy stays
    assert any("backups" in r for r in result["remains"])
    assert not raw_store.hot_file(hot).exists() and raw_store.hot_file(kept).exists()
    with pytest.raises(YimiError) as erased:
        raw_store.read_original(RawObject.objects.get(pk=hot.pk))
    assert erased.value.code == "original_erased"
    raw_store.register_cold_eraser(eraser)
    hooks.append(eraser)
    again = raw_store.erase_originals(owner.pk, [hot.pk, kept.pk])
    assert again["erased"] == [kept.pk] and again["not_found"] == [hot.pk] and asked == [[kept.pk]]
    assert (again["cold_erased"], again["cold_pending"], again["cold_packs"]) == ([kept.pk], [], ["p1"])


# --- the voice socket: archived as it arrives, analysed only once written -----------------------------------

voice_assets = voice_support.voice_assets
voice_catalog = voice_support.voice_catalog
transcription_server = test_asr.transcription_server
remote_asr = test_asr.remote_asr


@pytest.mark.django_db(transaction=True)
async def test_voice_audio_is_archived_in_batches_before_analysis_sees_it(
    voice_catalog: dict[str, Any], remote_asr: TranscriptionServer, make_device: Any, disk: Disk, settings: Any
) -> None:
    remote_asr.reply = "the shop is called Blue Bottle"
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    started = await start(comm)
    audio = np.concatenate([voice_catalog["speech"].say(voice_support.SENTENCES[0]), voice_support.silence(1.0)])
    sent = b"".join(voice_support.frames(audio))
    for frame in voice_support.frames(audio):
        await comm.send_to(bytes_data=frame)
    heard = await utterance(comm, timeout=30)
    assert heard["disposition"] == "ambient" and heard["ambient"]["analysis"] == "queued", heard
    # When analysis was given the speech, every batch up to its end was already written.
    rows = await db_async(lambda: list(RawObject.objects.filter(stream=started["session_id"]).order_by("stream_offset")))()
    covered = sum(r.size for r in rows) // 2
    assert rows and covered >= heard["end_ms"] * 16
    await comm.send_json_to({"type": "voice.stop", "id": "x"})
    await receive_until(comm, "voice.stopped")
    rows = await db_async(lambda: list(RawObject.objects.filter(stream=started["session_id"]).order_by("stream_offset")))()
    assert b"".join(Path(settings.RAW_HOT_ROOT, r.hot_path).read_bytes() for r in rows) == sent  # every sample, in order
    assert all(r.kind == "audio" and r.channel == "phone_app" and r.device_id == sim.device.id for r in rows)
    # Each batch was written as soon as it reached 64 KiB (its last 6,400-byte frame crossed it) or 20 frames.
    assert all(r.size - 6400 < 64 * 1024 and r.meta["frames"] <= 20 for r in rows)
    assert [r.stream_offset for r in rows] == [sum(x.size for x in rows[:i]) // 2 for i in range(len(rows))]
    await ambient.analysis.idle()
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_full_disk_gets_an_honest_error_frame_and_no_analysis(
    voice_catalog: dict[str, Any], remote_asr: TranscriptionServer, make_device: Any, disk: Disk, settings: Any
) -> None:
    remote_asr.reply = "never transcribed"
    disk.bytes = GiB
    sim = await db_async(make_device)()
    comm = await open_voice(sim)
    await start(comm)
    await stream(comm, voice_catalog["speech"].say(voice_support.SENTENCES[1]))
    # The error frames and the utterance come from this socket; the notice comes through the
    # owner's group, so it may arrive before or after the utterance: read until both are here.
    frames: list[dict[str, Any]] = []
    heard: dict[str, Any] | None = None
    while heard is None or not any(f["type"] == "notice" for f in frames):
        frame = await comm.receive_json_from(timeout=30)
        if frame["type"] == "voice.utterance":
            heard = frame
        else:
            frames.append(frame)
    errors = [f for f in frames if f["type"] == "error"]
    [notice] = [f for f in frames if f["type"] == "notice"]  # the owner's devices are told too
    assert notice["code"] == "original_not_stored" and notice["seq"] == errors[0]["seq"]
    assert heard["disposition"] == "ambient" and heard["ambient"] == {"analysis": "refused", "code": "storage_full"}, heard
    # Every batch refused is said to the device; the first names the timeline entry, the rest are covered by it.
    assert errors and {e["code"] for e in errors} == {"storage_full"}
    assert all(e["original"]["stored"] is False and e["original"]["kind"] == "audio" and e["original"]["reason"] == "bytes" for e in errors)
    assert errors[0]["original"]["start_ms"] == 0 and all(a["original"]["end_ms"] == b["original"]["start_ms"] for a, b in zip(errors, errors[1:], strict=False))
    refused = errors[0]
    assert isinstance(refused["seq"], int) and all(e["seq"] is None for e in errors[1:])
    entries = await db_async(lambda: [(e.seq, e.notice_code, e.text) for e in TimelineEntry.objects.filter(owner=sim.device.owner)])()
    assert len(entries) == 1 and entries[0][0] == refused["seq"] and "was not stored" in entries[0][2]
    assert await db_async(RawObject.objects.count)() == 0 and hot_files(Path(settings.RAW_HOT_ROOT)) == []
    await ambient.analysis.idle()
    assert remote_asr.requests == []
    await comm.disconnect()


# --- recall's L5 layer ------------------------------------------------------------------------------------------


def test_recall_finds_the_original_by_time_and_source_and_fetches_it(owner: Any, make_device: Any, disk: Disk, hooks: list[Any]) -> None:
    """"刚才那家店叫什么": the recent image and audio segment, from the hot store, with what
    was overheard; an older original is outside "just now"; a gone hot copy comes from the
    cold reader or is said to be unavailable; an erased one is skipped."""
    from django.utils import timezone

    from memory import recall
    from memory.personal import ambient as ambient_log
    from memory.personal.ambient import AmbientSource

    glasses, phone = make_device("glasses").device, make_device("phone").device
    now = timezone.now()
    image = store(owner, b"\xff\xd8\xff" + b"j" * 500, kind="image", at=now - timedelta(minutes=2),
                  source=capture(owner, glasses, "glasses"))
    batches = [
        store(owner, b"\x01\x00" * 8000, at=now - timedelta(seconds=60) + timedelta(milliseconds=500 * i),
              source=capture(owner, phone, "phone_app"), stream="s1", stream_offset=8000 * i)
        for i in range(3)
    ]
    old = store(owner, at=now - timedelta(hours=2), source=capture(owner, phone, "phone_app"), stream="s0")
    ambient_log.record(
        owner.pk, AmbientSource(phone.id, phone.name, "phone_app", uuid.uuid4(), "owner"), start_sample=0, end_sample=16_000,
        heard_at=now - timedelta(seconds=59), text="the shop is called Blue Bottle",
    )
    result = recall.recall(owner.pk, "刚才那家店叫什么", embedder=None)
    assert "l5" in result.layers and "l5" not in result.unavailable
    found = {o["kind"]: o for o in result.originals}
    assert set(found) == {"image", "audio"} and old.pk not in {i for o in result.originals for i in o["object_ids"]}
    assert found["audio"]["object_ids"] == [b.pk for b in batches] and found["audio"]["heard"] == ["the shop is called Blue Bottle"]
    assert found["audio"]["channel"] == "phone_app" and found["audio"]["device_id"] == str(phone.id)
    assert (found["audio"]["available"], found["audio"]["source"], found["audio"]["fetched_bytes"]) == (True, "hot", 48_000)
    assert found["image"]["object_ids"] == [image.pk] and found["image"]["source"] == "hot"
    assert result.payload()["originals"] == result.originals
    seen = recall.recall(owner.pk, "刚才眼镜看到的那家店叫什么", embedder=None)
    assert [o["object_ids"] for o in seen.originals] == [[image.pk]]  # the glasses' channel only
    # The hot copy is gone: one read from the cold reader, else unavailable (said, not dropped).
    RawObject.objects.filter(pk=image.pk).update(hot_deleted_at=now)
    raw_store.hot_file(image).unlink()
    gone = recall.recall(owner.pk, "刚才眼镜看到的那家店叫什么", embedder=None).originals[0]
    assert (gone["available"], gone["unavailable"]) == (False, "no_cold_store")

    def cold(o: RawObject) -> bytes | None:
        return b"\xff\xd8\xff" + b"j" * 500 if o.pk == image.pk else None

    raw_store.register_cold_reader(cold)
    hooks.append(cold)
    back = recall.recall(owner.pk, "刚才眼镜看到的那家店叫什么", embedder=None).originals[0]
    assert (back["available"], back["source"], back["fetched_bytes"]) == (True, "cold", 503)
    RawObject.objects.filter(pk=image.pk).update(erased_at=now)
    assert recall.recall(owner.pk, "刚才眼镜看到的那家店叫什么", embedder=None).originals == []


# --- sensor events over the device socket ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_a_sensor_event_is_kept_as_its_original_or_said_not_stored(make_device: Any, disk: Disk, settings: Any) -> None:
    from tests.devices.test_owner_mac import open_device
    from tests.memory.test_health_pack import ride, submit
    from tests.memory.test_location_pack import device_of_kind

    watch = await db_async(device_of_kind)(make_device, "watch")
    comm = await open_device(watch)
    try:
        frame = ride()
        ok = await submit(comm, frame)
        assert ok["type"] == "health.record.ok" and ok["original"] == "stored", ok
        obj = await db_async(RawObject.objects.get)(pk=ok["raw_id"])
        assert (obj.kind, obj.codec, obj.device_id, obj.meta) == ("sensor", "application/json", watch.device.id, {"event": "health.record"})
        assert json.loads(Path(settings.RAW_HOT_ROOT, obj.hot_path).read_bytes()) == frame
        assert obj.started_at.isoformat() == frame["start"] and obj.ended_at.isoformat() == frame["end"]
        again = await submit(comm, frame)
        assert again["duplicate"] is True and "original" not in again  # a resend is not a second original
        disk.inodes = 10
        full = await submit(comm, ride())
        assert full["type"] == "health.record.ok" and (full["original"], full["code"]) == ("not_stored", "storage_full"), full
        assert isinstance(full["seq"], int)
    finally:
        await comm.disconnect()
    assert await db_async(RawObject.objects.count)() == 1


# --- erasure of originals through memory.timeline.erasure, and images as originals -------------------------------------------


def test_erasing_a_closed_time_range_erases_its_originals_and_says_what_remains(
    owner: Any, disk: Disk, django_capture_on_commit_callbacks: Any
) -> None:
    from django.utils import timezone

    from memory.timeline import erasure

    now = timezone.now()
    inside = [store(owner, at=now - timedelta(minutes=10)), store(owner, kind="sensor", at=now - timedelta(minutes=9))]
    outside = store(owner, at=now - timedelta(hours=2))
    criteria = {"after": (now - timedelta(minutes=30)).isoformat(), "before": (now - timedelta(minutes=1)).isoformat()}
    seen = erasure.preview(owner.pk, criteria)
    assert seen.payload()["originals"] == {"count": 2, "by_kind": {"audio": 1, "sensor": 1}} and seen.entries == []
    open_ended = erasure.preview(owner.pk, {"after": criteria["after"]})  # a range new recordings can still enter
    assert open_ended.payload()["originals"]["count"] == 0
    with django_capture_on_commit_callbacks(execute=True):
        result = erasure.erase(owner.pk, seen.token)
    originals = result["originals"]
    assert (originals["erased"], originals["hot_files_deleted"], originals["by_kind"]) == (2, 2, {"audio": 1, "sensor": 1})
    assert originals["ids"] == sorted(o.pk for o in inside) and originals["cold_pending"] == 0
    assert any("backups" in line for line in result["not_erased"])
    assert not any(raw_store.hot_file(o).exists() for o in inside) and raw_store.hot_file(outside).exists()
    assert RawObject.objects.filter(erased_at__isnull=False).count() == 2
    assert erasure.erase(owner.pk, seen.token)["replayed"] is True


def test_a_kept_image_becomes_an_original_and_erasing_its_entry_erases_it(
    owner: Any, make_device: Any, disk: Disk, django_capture_on_commit_callbacks: Any
) -> None:
    from memory.personal import images as image_store
    from memory.timeline import erasure
    from tests.devices.test_images import picture

    glasses = make_device("glasses", capture_channels=["glasses"]).device
    data = picture()
    uploaded = image_store.store_upload(device=glasses, scope="owner", data=data)
    attached = image_store.attach_image(device=glasses, scope="owner", image_id=uploaded.id, client_id="img-1", captured_at=T0)
    obj = RawObject.objects.get(kind="image")
    assert (obj.meta["image_id"], obj.channel, obj.device_id, obj.codec, obj.started_at) == (str(uploaded.id), "glasses", glasses.id, "image/jpeg", T0)
    assert raw_store.read_original(obj).data == data
    assert image_store.archive_image(attached.image) is None and RawObject.objects.count() == 1  # once per image
    seen = erasure.preview(owner.pk, {"seqs": [attached.entry.seq]})
    assert seen.payload()["originals"] == {"count": 1, "by_kind": {"image": 1}}
    with django_capture_on_commit_callbacks(execute=True):
        result = erasure.erase(owner.pk, seen.token)
    assert result["images"] == [str(uploaded.id)] and result["originals"]["ids"] == [obj.pk]
    assert not raw_store.hot_file(obj).exists() and RawObject.objects.get(pk=obj.pk).erased_at is not None


def test_a_guests_image_is_not_an_original(owner: Any, make_device: Any, disk: Disk) -> None:
    from memory.personal import images as image_store
    from tests.devices.test_images import picture

    guest = make_device("phone", guest=True).device
    uploaded = image_store.store_upload(device=guest, scope="guest", data=picture())
    image_store.attach_image(device=guest, scope="guest", image_id=uploaded.id, client_id="g-1", captured_at=None)
    assert not RawObject.objects.exists()


def test_the_owner_sees_the_originals_in_the_admin_read_only(owner: Any, disk: Disk) -> None:
    from django.test import Client

    kept, gone = store(owner, kind="sensor"), store(owner)
    RawObject.objects.filter(pk=gone.pk).update(hot_deleted_at=T0)
    client = Client()
    client.force_login(owner)
    page = client.get("/admin/memory/rawobject/").content.decode()
    assert "application/json" in page and "deleted (cold only)" in page and kept.hot_path not in page
    assert client.get(f"/admin/memory/rawobject/{kept.pk}/change/").status_code == 200
    assert client.get("/admin/memory/rawobject/add/").status_code == 403
