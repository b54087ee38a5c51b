"""Cold packs (issue 19; docs/memory.md "Cold packs"): the L5P1 format, and migration to a
real WebDAV server (wsgidav in a child process) with verification before any hot copy goes."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import struct
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from accounts.voice import end_call, start_call
from memory.archive import cold_store as archive
from memory.archive import coldpack, raw_store
from memory.archive.models import ColdAlert, ColdPack, ObjectLocation, RawObject
from memory.archive.webdav import WebDAV
from memory.tasks import archive_round_task
from tests.conftest import need_program
from tests.support.webdav_support import PASSWORD, USER, WsgiDAVServer, webdav  # noqa: F401  (fixture)
from yimi_project.errors import YimiError

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
PCM = "pcm_s16le_16k_mono"


def speechlike(seconds: float, seed: int = 0) -> bytes:
    """16 kHz s16 PCM with the extremes of the range in it (FLAC must keep every sample)."""
    rng = np.random.default_rng(seed)
    n = int(16000 * seconds)
    t = np.arange(n) / 16000
    wave = 9000 * np.sin(2 * np.pi * 220 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)) + rng.normal(0, 400, n)
    samples = np.clip(wave, -32768, 32767).astype("<i2")
    samples[:4] = [-32768, 32767, 0, -1]
    return samples.tobytes()


# --- the format ----------------------------------------------------------------------------------


def test_pack_round_trip_checks_every_chunk() -> None:
    originals = {"1": (PCM, speechlike(1.0)), "2": ("image/jpeg", os.urandom(3000)), "3": ("application/json", b'{"lux": 12}')}
    builder = coldpack.PackBuilder()
    for oid, (codec, data) in originals.items():
        builder.add(oid, codec, data)
    data = builder.seal()
    assert data[:4] == b"L5P1" and struct.unpack(">I", data[4:8])[0] == coldpack.decode_header(data).data_start - 8
    header = json.loads(gzip.decompress(data[8 : coldpack.decode_header(data).data_start]))
    assert header["format"] == "L5P1"
    assert [(c["id"], c["codec"]) for c in header["chunks"]] == [("1", "flac"), ("2", "gzip"), ("3", "gzip")]
    assert set(header["chunks"][0]) == {"id", "codec", "offset", "size", "decoded_size", "sha256"}
    decoded = {chunk.id: out for chunk, out in coldpack.decode_pack(data)}
    assert decoded == {oid: d for oid, (_c, d) in originals.items()}

    broken = bytearray(data)
    broken[-3] ^= 0xFF  # a byte of the last (gzip) chunk
    with pytest.raises(Exception) as err:
        list(coldpack.decode_pack(bytes(broken)))
    assert getattr(err.value, "code", "") == "pack_invalid"
    with pytest.raises(Exception) as err:
        list(coldpack.decode_pack(b"L5P2" + data[4:]))
    assert getattr(err.value, "code", "") == "pack_invalid"
    with pytest.raises(Exception) as err:
        list(coldpack.decode_pack(data + b"x"))
    assert getattr(err.value, "code", "") == "pack_invalid"


def test_flac_round_trip_is_bit_exact() -> None:
    pcm = speechlike(3.0, seed=7)
    codec, encoded = coldpack.encode_chunk(PCM, pcm)
    assert codec == "flac" and encoded[:4] == b"fLaC" and len(encoded) < len(pcm)
    assert coldpack.flac_decode(encoded) == pcm
    # An odd byte count is not 16-bit PCM: kept losslessly with gzip instead.
    assert coldpack.encode_chunk(PCM, pcm[:-1])[0] == "gzip"
    # A pack of many short batches is coded in grouped ffmpeg calls, each stream still its own FLAC.
    batches = [speechlike(0.5, seed=s) for s in range(6)]
    builder = coldpack.PackBuilder()
    builder.add_many([(str(i), PCM, b) for i, b in enumerate(batches)])
    data = builder.seal()
    assert all(c.codec == "flac" for c in builder.chunks)
    assert [out for _c, out in coldpack.decode_pack(data)] == batches
    header = coldpack.decode_header(data)
    broken = bytearray(data)
    broken[header.data_start + header.chunks[3].offset + header.chunks[3].size // 2] ^= 0x55
    with pytest.raises(Exception) as err:
        list(coldpack.decode_pack(bytes(broken)))
    assert getattr(err.value, "code", "") == "pack_invalid" and "chunk 3" in str(err.value)


def test_an_ffmpeg_call_over_its_time_limit_is_killed_and_is_an_error(monkeypatch: Any) -> None:
    monkeypatch.setattr(coldpack, "FFMPEG_SECONDS", 0.001)  # no ffmpeg starts in a millisecond
    with pytest.raises(Exception) as err:
        coldpack.encode_chunk(PCM, speechlike(0.5))
    assert getattr(err.value, "code", "") == "flac_timeout"


def test_header_limits_before_and_after_compression() -> None:
    many = [coldpack.Chunk(f"{i:09d}" + "x" * 60, "gzip", i, 1, 1, hashlib.sha256(str(i).encode()).hexdigest()) for i in range(9000)]
    with pytest.raises(Exception) as err:
        coldpack.encode_header(many)
    assert getattr(err.value, "code", "") == "header_too_large"
    # A header that says it is over 1 MiB compressed is refused before anything is inflated.
    with pytest.raises(Exception) as err:
        coldpack.header_length(b"L5P1" + struct.pack(">I", coldpack.MAX_HEADER_BYTES + 1))
    assert getattr(err.value, "code", "") == "pack_invalid"
    # Decoded and transfer limits: the builder refuses, and a header claiming more is invalid.
    builder = coldpack.PackBuilder()
    with pytest.raises(Exception) as err:
        builder.add_encoded("1", "gzip", b"x", coldpack.MAX_DECODED_BYTES + 1, "0" * 64)
    assert getattr(err.value, "code", "") == "pack_full"
    with pytest.raises(Exception) as err:
        builder.add_encoded("1", "gzip", bytes(coldpack.MAX_PACK_BYTES), 10, "0" * 64)
    assert getattr(err.value, "code", "") == "pack_full"
    claims = coldpack.encode_header([coldpack.Chunk("1", "gzip", 0, 1, coldpack.MAX_DECODED_BYTES + 1, "0" * 64)])
    with pytest.raises(Exception) as err:
        coldpack.decode_header(claims + b"x")
    assert getattr(err.value, "code", "") == "pack_invalid"
    assert coldpack.PackBuilder(max_objects=2).fits(10) and not coldpack.PackBuilder(max_objects=0).fits(10)


# --- migration -----------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Now:
    def __init__(self, at: datetime = T0) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


class ServerDAV(WebDAV):
    """The client under test against the real server, with a hook after each PUT (a test
    corrupts the stored file there, stops the server, or starts a call)."""

    def __init__(self, server: WsgiDAVServer, after_put: Callable[[str], None] | None = None) -> None:
        super().__init__(server.url, USER, PASSWORD)
        self.server, self.after_put, self.puts = server, after_put, 0

    def put(self, path: str, data: bytes) -> None:
        self.puts += 1
        if self.after_put is not None:
            self.after_put(path)
        super().put(path, data)


def corrupt(server: WsgiDAVServer, path: str) -> None:
    file = server.root / path
    raw = bytearray(file.read_bytes())
    raw[-1] ^= 0x01
    file.write_bytes(bytes(raw))


@pytest.fixture
def cold(settings: Any, tmp_path: Path, webdav: WsgiDAVServer, owner: Any) -> Iterator[WsgiDAVServer]:  # noqa: F811
    need_program("ffmpeg")  # PCM originals are sealed as FLAC
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "cold_webdav_password").write_text(PASSWORD + "\n")
    settings.SECRETS_DIR = secrets
    settings.RAW_HOT_ROOT = tmp_path / "raw"
    settings.DISK_RESERVE_BYTES = 0
    settings.DISK_RESERVE_INODES = 0
    settings.COLD_WEBDAV_URL = webdav.url
    settings.COLD_WEBDAV_USER = USER
    settings.COLD_MAX_UPLOAD_KBPS = 0
    archive.register()
    try:
        yield webdav
    finally:
        archive.unregister()


def store(owner: Any, data: bytes, codec: str = PCM, kind: str = "audio", at: datetime = T0) -> RawObject:
    capture = raw_store.Capture(owner_id=owner.pk, device_id=None, channel="phone_app")
    obj = raw_store.store_original(capture, kind=kind, codec=codec, data=data, started_at=at, ended_at=at + timedelta(seconds=1), now=at)
    RawObject.objects.filter(pk=obj.pk).update(stored_at=at)
    obj.refresh_from_db()
    return obj


def hot_intact(*objs: RawObject) -> bool:
    return all(
        RawObject.objects.get(pk=o.pk).hot_deleted_at is None and raw_store.hot_file(o).read_bytes() and
        hashlib.sha256(raw_store.hot_file(o).read_bytes()).hexdigest() == o.sha256
        for o in objs
    )


def three(owner: Any, at: datetime = T0) -> list[RawObject]:
    return [store(owner, speechlike(2.0, seed=1), at=at), store(owner, os.urandom(5000), "image/jpeg", "image", at=at),
            store(owner, b'{"steps": 40}', "application/json", "sensor", at=at)]


def test_round_verifies_before_indexing_and_a_read_is_one_range_request(cold: WsgiDAVServer, owner: Any) -> None:
    objs = three(owner)
    report = archive.migrate_round(owner.pk, clock=Clock(), now=Now())
    assert report.stopped == "done" and report.objects_packed == 3 and len(report.packs_verified) == 1
    pack = ColdPack.objects.get()
    assert pack.state == "verified" and pack.verified_at == T0 and pack.reverified_at is None
    assert ObjectLocation.objects.filter(pack=pack).count() == 3
    assert hot_intact(*objs)  # a round never deletes a hot copy
    # Verified once is not enough: no hot copy goes without the second verification.
    assert raw_store.delete_hot_copies([o.pk for o in objs], reason="test") == [] and hot_intact(*objs)
    assert cold.files() == [pack.path]
    # The round read the whole pack back after its PUT.
    assert [(m, r) for m, p, r in cold.requests() if p == "/" + pack.path] == [("PUT", ""), ("GET", "")]

    before = len(cold.requests())
    assert archive.read_object(objs[1]) == raw_store.hot_file(objs[1]).read_bytes()
    location = ObjectLocation.objects.get(object=objs[1])
    assert cold.requests()[before:] == [("GET", "/" + pack.path, f"bytes={location.offset}-{location.offset + location.size - 1}")]
    assert location.size < pack.size


def test_upload_verification_failure_keeps_hot_copies(cold: WsgiDAVServer, owner: Any) -> None:
    objs = three(owner)
    dav = ServerDAV(cold)
    real_put = WebDAV.put

    def put_then_rot(path: str, data: bytes) -> None:  # the storage changes a byte after accepting it
        real_put(dav, path, data)
        corrupt(cold, path)

    dav.put = put_then_rot  # type: ignore[method-assign]
    report = archive.migrate_round(owner.pk, clock=Clock(), now=Now(), dav=dav)
    assert report.packs_failed == ["pack_invalid"] and not report.packs_verified and report.stopped == "pack_invalid"
    pack = ColdPack.objects.get()
    assert pack.state == "failed" and not ObjectLocation.objects.exists()
    alert = ColdAlert.objects.get()
    assert alert.code == "verification_failed_upload" and alert.pack == pack
    assert archive.verified_ids([o.pk for o in objs]) == set()
    assert raw_store.delete_hot_copies([o.pk for o in objs], reason="test", now=T0) == []
    assert archive.reclaim(cold.root, 10**9, 10, now=Now(T0 + timedelta(days=9)), dav=ServerDAV(cold)) == 0
    assert hot_intact(*objs)
    # The next round packs them again, and this time the copy proves itself.
    again = archive.migrate_round(owner.pk, clock=Clock(), now=Now(T0 + timedelta(minutes=1)), dav=ServerDAV(cold))
    assert again.objects_packed == 3 and ObjectLocation.objects.count() == 3


def test_retention_then_second_verification_deletes_hot_copies(cold: WsgiDAVServer, owner: Any, settings: Any) -> None:
    assert settings.COLD_HOT_RETENTION_SECONDS == 2 * 86400  # the default
    objs = three(owner)
    archive.migrate_round(owner.pk, clock=Clock(), now=Now())
    pack = ColdPack.objects.get()
    with ServerDAV(cold) as dav:
        assert archive.release_due(owner.pk, now=Now(T0 + timedelta(days=2) - timedelta(seconds=1)), dav=dav) == []
        assert hot_intact(*objs)
        gets_before = sum(1 for m, p, _r in cold.requests() if m == "GET" and p == "/" + pack.path)
        assert archive.release_due(owner.pk, now=Now(T0 + timedelta(days=2, seconds=1)), dav=dav) == [pack.path]
    assert sum(1 for m, p, _r in cold.requests() if m == "GET" and p == "/" + pack.path) == gets_before + 1  # downloaded again
    pack.refresh_from_db()
    assert pack.reverified_at == T0 + timedelta(days=2, seconds=1) and pack.released_at is not None
    for obj in objs:
        assert RawObject.objects.get(pk=obj.pk).hot_deleted_at is not None and not raw_store.hot_file(obj).exists()
        original = raw_store.read_original(RawObject.objects.get(pk=obj.pk))
        assert original.source == "cold" and hashlib.sha256(original.data).hexdigest() == obj.sha256


def test_second_verification_failure_at_deletion_keeps_every_hot_copy(cold: WsgiDAVServer, owner: Any) -> None:
    objs = three(owner)
    archive.migrate_round(owner.pk, clock=Clock(), now=Now())
    pack = ColdPack.objects.get()
    corrupt(cold, pack.path)  # the cold copy rotted after it was verified
    with ServerDAV(cold) as dav:
        assert archive.release_due(owner.pk, now=Now(T0 + timedelta(days=3)), dav=dav) == []
    pack.refresh_from_db()
    assert pack.state == "failed" and pack.failure == "pack_invalid"
    assert ColdAlert.objects.get().code == "verification_failed_deletion"
    assert hot_intact(*objs)
    assert not ObjectLocation.objects.exists()  # packed again by a later round
    assert {o.pk for o in archive.candidates(owner.pk)} == {o.pk for o in objs}


def test_no_pack_starts_during_a_call_or_push_to_talk(cold: WsgiDAVServer, owner: Any, make_device: Any) -> None:
    objs = three(owner)
    device = make_device().device
    call = start_call(device, "call-1", "phone_app")
    report = archive.migrate_round(owner.pk, clock=Clock(), now=Now())
    assert report.stopped == "busy:call" and not ColdPack.objects.exists() and cold.files() == []
    end_call(call)

    def push_to_talk(owner_id: int) -> str | None:
        return "push_to_talk"

    archive.register_busy_check(push_to_talk)
    try:
        assert archive.migrate_round(owner.pk, clock=Clock(), now=Now()).stopped == "busy:push_to_talk"
    finally:
        archive.unregister_busy_check(push_to_talk)
    assert archive.migrate_round(owner.pk, clock=Clock(), now=Now()).objects_packed == len(objs)


def test_a_started_upload_finishes_when_a_call_starts(cold: WsgiDAVServer, owner: Any, make_device: Any) -> None:
    objs = [store(owner, os.urandom(4000), "image/jpeg", "image") for _ in range(4)]
    device = make_device().device
    dav = ServerDAV(cold, after_put=lambda path: start_call(device, "call-2", "phone_app"))
    report = archive.migrate_round(owner.pk, clock=Clock(), now=Now(), dav=dav, seal_bytes=8000)
    # The first pack (two originals) was under way when the call started: it finished and verified.
    assert report.stopped == "busy:call" and len(report.packs_verified) == 1 and dav.puts == 1
    assert ObjectLocation.objects.count() == 2 and hot_intact(*objs)


def test_round_bounds_budget_and_start_spacing(cold: WsgiDAVServer, owner: Any, settings: Any) -> None:
    [store(owner, os.urandom(4000), "image/jpeg", "image") for _ in range(7)]
    clock = Clock()
    report = archive.migrate_round(owner.pk, clock=clock, now=Now(), seal_bytes=4000)
    assert len(report.packs_verified) == archive.MAX_PACKS and report.stopped == "packs"  # at most two packs a round
    # The budget: once 5 s of work is spent no new pack starts (the started one finishes).
    dav = ServerDAV(cold, after_put=lambda path: setattr(clock, "t", clock.t + archive.BUDGET_SECONDS))
    report = archive.migrate_round(owner.pk, clock=clock, now=Now(), dav=dav, seal_bytes=4000)
    assert report.stopped == "budget" and len(report.packs_verified) == 1
    # Spacing: at 8 kbps a 4 kB pack holds the next start back about 4 s.
    settings.COLD_MAX_UPLOAD_KBPS = 8
    last = ColdPack.objects.order_by("-started_at").first()
    assert last is not None
    gap = timedelta(seconds=last.size * 8 / 8000)
    assert archive.migrate_round(owner.pk, clock=Clock(), now=Now(last.started_at + gap - timedelta(milliseconds=1)), seal_bytes=4000).stopped == "spacing"
    assert len(archive.migrate_round(owner.pk, clock=Clock(), now=Now(last.started_at + gap), seal_bytes=4000).packs_verified) == 1


def test_webdav_outage_mid_upload_loses_nothing(cold: WsgiDAVServer, owner: Any) -> None:
    objs = [store(owner, os.urandom(9000), "image/jpeg", "image") for _ in range(4)]
    dav = ServerDAV(cold, after_put=lambda path: cold.stop() if dav.puts == 2 else None)
    report = archive.migrate_round(owner.pk, clock=Clock(), now=Now(), dav=dav, seal_bytes=15_000)
    assert report.stopped == "cold_storage_unavailable" and len(report.packs_verified) == 1
    assert report.packs_failed == ["cold_storage_unavailable"]
    assert hot_intact(*objs)
    packed = set(ObjectLocation.objects.values_list("object_id", flat=True))
    assert len(packed) == 2 and ColdPack.objects.filter(state="failed").count() == 1
    assert not ColdAlert.objects.exists()  # an outage is not a verification failure
    cold.start()  # the server is back: the next round retries those originals
    again = archive.migrate_round(owner.pk, clock=Clock(), now=Now(T0 + timedelta(minutes=1)), dav=ServerDAV(cold), seal_bytes=15_000)
    assert again.objects_packed == 2 and set(ObjectLocation.objects.values_list("object_id", flat=True)) == {o.pk for o in objs}
    for obj in objs:
        assert archive.read_object(obj) == raw_store.hot_file(obj).read_bytes()


def test_erasure_rewrites_the_pack_and_says_what_remains(cold: WsgiDAVServer, owner: Any) -> None:
    objs = three(owner)
    archive.migrate_round(owner.pk, clock=Clock(), now=Now())
    old = ColdPack.objects.get()
    secret = raw_store.hot_file(objs[1]).read_bytes()
    result = raw_store.erase_originals(owner.pk, [objs[1].pk])
    assert result["erased"] == [objs[1].pk] and result["cold_erased"] == [objs[1].pk] and result["cold_pending"] == []
    old.refresh_from_db()
    new = ColdPack.objects.get(state="verified")
    assert old.state == "retired" and old.replaced_by == new and old.file_deleted_at is not None
    assert set(result["cold_packs"]) == {old.path, new.path} and cold.files() == [new.path]
    assert any("backups" in line for line in result["remains"])
    stored = (cold.root / new.path).read_bytes()
    assert [c.id for c, _ in coldpack.decode_pack(stored)] == [str(objs[0].pk), str(objs[2].pk)]
    assert gzip.compress(secret, compresslevel=1, mtime=0) not in stored
    for kept in (objs[0], objs[2]):
        assert archive.read_object(kept) == raw_store.hot_file(kept).read_bytes()


def test_archive_command_prints_status_and_progress(cold: WsgiDAVServer, owner: Any, capsys: Any) -> None:
    # The command runs on the real clock: originals stored now stay within the 2-day hot
    # retention, so verifying their pack deletes no hot copy (stored at T0 they were
    # reclaimed once T0 was two days past, and restore had to fetch them back).
    objs = three(owner, at=timezone.now())
    call_command("archive", "status")
    out = capsys.readouterr().out
    assert "waiting for a cold copy: 3" in out and "packs: pending 0, verified 0" in out
    call_command("archive", "migrate")
    out = capsys.readouterr().out
    assert "3 originals wait" in out and "verified (3 originals)" in out
    pack = ColdPack.objects.get()
    call_command("archive", "verify", str(pack.pk))
    assert "verified: 3 chunks" in capsys.readouterr().out
    call_command("archive", "restore", str(objs[0].pk))
    assert "the hot copy is there and intact" in capsys.readouterr().out
    with pytest.raises(Exception) as err:
        call_command("archive", "verify", "not-a-pack")
    assert "not_found" in str(err.value) or "no pack" in str(err.value)


def test_restore_puts_the_hot_copy_back_with_admission_or_writes_a_file(
    cold: WsgiDAVServer, owner: Any, capsys: Any, settings: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    objs = three(owner)
    archive.migrate_round(owner.pk, clock=Clock(), now=Now())
    with ServerDAV(cold) as dav:
        archive.release_due(owner.pk, now=Now(T0 + timedelta(days=3)), dav=dav)
    audio, image = (RawObject.objects.get(pk=o.pk) for o in objs[:2])
    assert audio.hot_deleted_at is not None and not raw_store.hot_file(audio).exists()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # nothing may land in the current directory

    # --out: the file only; the hot copy stays gone.
    out = tmp_path / "out" / "image.bin"
    out.parent.mkdir()
    call_command("archive", "restore", str(image.pk), "--out", str(out))
    assert "wrote the cold copy to" in capsys.readouterr().out
    assert hashlib.sha256(out.read_bytes()).hexdigest() == image.sha256
    assert RawObject.objects.get(pk=image.pk).hot_deleted_at is not None and not raw_store.hot_file(image).exists()

    # Admission refuses: nothing is written and the row is unchanged.
    settings.DISK_RESERVE_BYTES = 2**62
    with pytest.raises(Exception) as err:
        call_command("archive", "restore", str(audio.pk))
    assert "storage_full" in str(err.value)
    assert RawObject.objects.get(pk=audio.pk).hot_deleted_at is not None and not raw_store.hot_file(audio).exists()

    # The default: the hot copy back, at its path, read from one range of the pack.
    settings.DISK_RESERVE_BYTES = 0
    call_command("archive", "restore", str(audio.pk))
    assert "restored the hot copy from its cold pack" in capsys.readouterr().out
    assert hot_intact(audio) and raw_store.read_original(RawObject.objects.get(pk=audio.pk)).source == "hot"
    assert list(cwd.iterdir()) == []
    with pytest.raises(Exception) as err:
        call_command("archive", "restore", "999999999")
    assert "not_found" in str(err.value)


def test_emergency_reclaim_verifies_again_deletes_early_and_alerts(cold: WsgiDAVServer, owner: Any) -> None:
    objs = three(owner)
    unpacked = store(owner, os.urandom(2000), "image/jpeg", "image", at=T0)
    archive.migrate_round(owner.pk, clock=Clock(), now=Now(), seal_bytes=1)  # one original a pack, two packs
    assert ColdPack.objects.filter(state="verified").count() == 2
    with ServerDAV(cold) as dav:
        deleted = archive.reclaim(raw_store.hot_root(), 1, 1, now=Now(T0 + timedelta(minutes=5)), dav=dav)
    assert deleted == 1  # the oldest pack was enough; the other keeps its hot copy
    released = ColdPack.objects.get(released_at__isnull=False)
    assert released.reverified_at == T0 + timedelta(minutes=5)
    assert ColdAlert.objects.get().code == "hot_copies_deleted_early" and ColdAlert.objects.get().pack == released
    gone = {o.pk for o in objs + [unpacked] if not hot_intact(o)}
    assert gone == {ObjectLocation.objects.get(pack=released).object_id}


def test_the_admin_shows_the_archive_figures_packs_and_alerts(cold: WsgiDAVServer, owner: Any) -> None:
    three(owner)
    archive.migrate_round(owner.pk, clock=Clock(), now=Now())
    archive.raise_alert(owner.pk, "verification_failed_deletion", "pack x failed", ColdPack.objects.get())
    client = Client()
    client.force_login(owner)
    page = client.get("/admin/memory/coldpack/").content.decode()
    assert "Archive status" in page and "waiting for a cold copy: 0" in page and "packs: pending 0, verified 1" in page
    assert ColdPack.objects.get().path in page
    assert "pack x failed" in client.get("/admin/memory/coldalert/").content.decode()


def test_round_discovers_at_most_8192_candidates_and_packs_at_most_2048_a_pack(cold: WsgiDAVServer, owner: Any) -> None:
    # Set-up only: 8,193 small originals written straight to the hot root and indexed in bulk
    # (storing each through raw_store would fsync 8,193 times).
    root = raw_store.hot_root() / "bulk"
    root.mkdir(parents=True)
    rows = []
    for i in range(archive.MAX_CANDIDATES + 1):
        data = f"event {i}".encode()
        (root / f"{i}.json").write_bytes(data)
        rows.append(RawObject(owner=owner, channel="watch", kind="sensor", codec="application/json", started_at=T0, ended_at=T0,
                              size=len(data), sha256=hashlib.sha256(data).hexdigest(), hot_path=f"bulk/{i}.json"))
    RawObject.objects.bulk_create(rows)
    report = archive.migrate_round(owner.pk, clock=Clock(), now=Now())
    assert report.candidates == archive.MAX_CANDIDATES == 8192
    assert [p.object_count for p in ColdPack.objects.order_by("started_at")] == [2048, 2048]
    assert report.stopped == "packs" and ObjectLocation.objects.count() == 4096


def test_webdav_client_speaks_to_a_real_server_with_basic_auth(webdav: WsgiDAVServer) -> None:  # noqa: F811
    with WebDAV(webdav.url, USER, PASSWORD) as dav:
        assert dav.mkcol("l5") is True and dav.mkcol("l5") is False
        dav.put("l5/a.bin", b"0123456789")
        assert dav.get("l5/a.bin") == b"0123456789" and dav.get_range("l5/a.bin", 3, 4) == b"3456"
        listing = {e.path: e for e in dav.propfind("l5")}
        assert listing["l5/a.bin"].size == 10 and listing["l5/"].collection
        assert dav.delete("l5/a.bin") is True and dav.delete("l5/a.bin") is False
        with pytest.raises(Exception) as err:
            dav.get("l5/a.bin")
        assert getattr(err.value, "code", "") == "not_found"
    with WebDAV(webdav.url, USER, "wrong") as dav, pytest.raises(Exception) as err:
        dav.put("l5/b.bin", b"x")
    assert getattr(err.value, "code", "") == "cold_storage_unavailable" and "401" in str(err.value)
    assert not (webdav.root / "l5" / "b.bin").exists()


def test_erasure_while_the_server_is_down_is_pending_and_a_later_round_finishes_it(cold: WsgiDAVServer, owner: Any) -> None:
    objs = three(owner)
    archive.migrate_round(owner.pk, clock=Clock(), now=Now())
    old = ColdPack.objects.get()
    cold.stop()
    result = raw_store.erase_originals(owner.pk, [objs[2].pk])
    assert result["erased"] == [objs[2].pk] and result["cold_erased"] == [] and result["cold_pending"] == [objs[2].pk]
    assert any("cold_pending" in line for line in result["remains"])
    cold.start()
    archive.migrate_round(owner.pk, clock=Clock(), now=Now(T0 + timedelta(minutes=1)))
    new = ColdPack.objects.get(state="verified")
    assert new != old and cold.files() == [new.path]
    assert [c.id for c, _ in coldpack.decode_pack((cold.root / new.path).read_bytes())] == [str(objs[0].pk), str(objs[1].pk)]
    assert not ObjectLocation.objects.filter(object=objs[2]).exists()


def test_the_beat_task_runs_one_round_for_the_owner(cold: WsgiDAVServer, owner: Any, settings: Any) -> None:
    three(owner)
    assert settings.CELERY_BEAT_SCHEDULE["archive-round"]["task"] == archive_round_task.name
    result = archive_round_task.apply().get()
    assert result["objects_packed"] == 3 and result["stopped"] == "done" and ColdPack.objects.get().state == "verified"
    settings.COLD_WEBDAV_URL = ""
    assert archive_round_task.apply().get()["stopped"] == "not_configured"


def test_without_ffmpeg_sealing_stops_with_ffmpeg_missing_and_check_warns(monkeypatch: Any, tmp_path: Path) -> None:
    from memory.checks import ffmpeg_installed

    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no ffmpeg on it
    with pytest.raises(YimiError) as err:
        coldpack.flac_encode(b"\0\0" * 160)
    assert err.value.code == "ffmpeg_missing" and "apt-get install ffmpeg" in err.value.message
    assert [message.id for message in ffmpeg_installed()] == ["memory.W001"]
