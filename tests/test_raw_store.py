"""The L5 hot store (memory/raw_store.py; docs/memory.md "Raw store (L5)"): durable originals
with their source, disk admission on bytes AND inodes (an injected statvfs) with one reclaim
and an honest refusal, the owner told first when space is tight, archive batches at 500 ms /
20 frames / 64 KiB on an injected clock, reads from the hot copy or the cold reader, hot copies
deleted only when verified cold, erasure of originals, recall's L5 layer, and the voice socket
archiving before analysis. The ambient analysis bounds are tests/test_ambient.py's."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from memory import admission, raw_store
from memory.models import TimelineEntry
from memory.raw_models import RawObject
from memory.raw_store import ArchiveBatcher, Capture
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


@pytest.fixture
def hooks() -> Iterator[list[Any]]:
    """Hooks a test registers are removed afterwards."""
    registered: list[Any] = []
    yield registered
    for fn in registered:
        raw_store.unregister(fn)


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
    """Free inodes ≥ 500,000, whatever the free bytes (seed 3.5: 5 GiB left, too few inodes, refused)."""
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
