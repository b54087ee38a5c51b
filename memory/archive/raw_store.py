"""The L5 hot store: device originals on the local disk (flow F7 of
docs/architecture.md; docs/memory.md "Raw store (L5)"). The only code that writes ``RawObject``
and the files under the hot root (``RAW_HOT_ROOT``, default ``DATA_DIR/raw``).

1. **Store** (``store_original``): one original (an archive batch of audio, an image, a
   sensor event) with its owner, source device and capture channel.
   a. disk admission (``admit``) on the directory that will hold it, bytes AND inodes
      (``memory.archive.admission.check``); refused → reclaim (``register_reclaimer``: the cold-pack
      side deletes hot copies whose cold copy is verified) and check once more; still
      refused → ``not_stored``: a timeline entry says this original was not stored, and
      ``storage_full`` is raised for the device's error frame. Nothing is written, nothing
      pretends success. Admitted but tight (below ``DISK_WARN_BYTES`` / ``DISK_WARN_INODES``)
      → the owner gets a ``storage_low`` notice, at most one per ``RAW_NOTICE_INTERVAL_SECONDS``.
   b. the bytes go to a temporary file in the target directory, fsync, rename, fsync the
      directory (and every directory created on the way), so the name is durable;
   c. only then the row is written. A row whose ``hot_deleted_at`` is None points at a
      durable file; a crash between b and c leaves an unindexed file, never a row without one.
2. **Archive batches** (``ArchiveBatcher``): live audio frames are gathered and written
   whenever 500 ms (since the batch's first frame, on the injected clock), 20 frames or
   64 KiB is reached, whichever first. The voice socket feeds analysis only audio that a
   batch already made durable (devices/consumers/voice.py).
3. **Read** (``read_original``): the hot file (its SHA-256 checked); the hot copy gone →
   the registered cold reader (``register_cold_reader``: one range read from the cold pack);
   neither → ``original_unavailable``.
4. **Hot copies go** only through ``delete_hot_copies``, and only for objects the cold side
   says have a verified cold copy (``register_cold_verifier``); with no verifier registered
   nothing is deleted. Emergency reclaim (1a) uses the same path: never an unverified copy.
5. **Erasure** (``erase_originals``): hot files deleted, ``erased_at`` set, the cold side
   asked to rewrite or tombstone its packs (``register_cold_eraser``); the result says
   exactly what was erased and what remains.

The hooks are registered by the cold-pack side from its ``AppConfig.ready`` (or a test);
their contracts are in the ``register_*`` docstrings.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from memory.archive import admission
from memory.archive.models import RawObject
from memory.timeline import entries as timeline
from memory.timeline.models import TimelineEntry
from yimi_project import push
from yimi_project.errors import YimiError
from yimi_project.files import fsync_dir, write_atomically
from yimi_project.logs import log_event

PCM_CODEC = "pcm_s16le_16k_mono"
PCM_BYTES_PER_SECOND = 32_000
EXTENSIONS = {PCM_CODEC: "pcm", "image/jpeg": "jpg", "image/png": "png", "application/json": "json"}
MAX_OBJECT_BYTES = 64 * 1024 * 1024  # a cold pack decodes to at most 64 MiB: no single original is bigger
KINDS = {k.value for k in RawObject.Kind}
NOTICE_STORAGE_LOW = "storage_low"
NOTICE_NOT_STORED = "original_not_stored"
NOT_STORED_REPEAT_SECONDS = 60
ERASE_CHUNK = 5_000  # one "not stored" entry per device, channel and kind per minute


def hot_root() -> Path:
    return Path(settings.RAW_HOT_ROOT)


def hot_file(obj: RawObject) -> Path:
    return hot_root() / obj.hot_path


@dataclass(frozen=True)
class Capture:
    """Where an original came from: whose it is, which device, which capture channel."""

    owner_id: int
    device_id: uuid.UUID | None
    channel: str
    device_label: str = ""


def device_capture(device: Any, channel: str | None = None) -> Capture:
    """The capture of an original a device sent: the channel named, else the device's first
    declared capture channel, else its kind (a watch's sensor events)."""
    channels = getattr(device, "capture_channels", None) or []
    chosen = channel or (str(channels[0]) if channels else str(device.kind))
    return Capture(device.owner_id, device.id, chosen[:32], str(device.name))


# --- hooks the cold-pack side registers ---------------------------------------------------------

# (directory, missing bytes, missing inodes) -> how many hot copies it deleted.
Reclaimer = Callable[[Path, int, int], int]
# RawObject -> its bytes from the cold copy (one range read), or None when it has none.
ColdReader = Callable[[RawObject], "bytes | None"]
# ids -> the subset whose cold copy is verified (after upload, and again just before deletion).
ColdVerifier = Callable[[Sequence[int]], "set[int]"]
# (owner id, objects being erased) -> what became of their cold copies (see register_cold_eraser).
ColdEraser = Callable[[int, Sequence[RawObject]], dict[str, Any]]

_reclaimers: list[Reclaimer] = []
_cold_readers: list[ColdReader] = []
_cold_verifiers: list[ColdVerifier] = []
_cold_erasers: list[ColdEraser] = []


def register_reclaimer(fn: Reclaimer) -> None:
    """Called when admission refuses a write: ``fn(directory, missing_bytes, missing_inodes)``
    frees space on the file system holding ``directory`` and returns how many hot copies it
    deleted. It may delete only hot copies whose cold copy it has just verified (downloaded
    and checked again), through ``delete_hot_copies``; oldest first is the expected order.
    An exception is logged and counts as nothing freed."""
    if fn not in _reclaimers:
        _reclaimers.append(fn)


def register_cold_reader(fn: ColdReader) -> None:
    """``fn(obj)``: the original's bytes read from its cold pack (one HTTP range read of its
    chunk, decoded and checked against ``obj.sha256``), None when it has no cold copy.
    ``YimiError`` (e.g. ``cold_unavailable``) when the cold store cannot answer now."""
    if fn not in _cold_readers:
        _cold_readers.append(fn)


def register_cold_verifier(fn: ColdVerifier) -> None:
    """``fn(ids)``: the subset of ``ids`` whose cold copy passed verification (the whole
    pack read back, hashed, every chunk decoded and checked) and is indexed. The hot store
    deletes no hot copy that is not in this set."""
    if fn not in _cold_verifiers:
        _cold_verifiers.append(fn)


def register_cold_eraser(fn: ColdEraser) -> None:
    """``fn(owner_id, objects)`` during erasure, after the hot copies are gone: rewrite or
    tombstone every cold pack holding one of ``objects``. Returns ``{"erased": [ids whose
    cold copy is gone now], "pending": [ids still in a pack, to be rewritten later],
    "packs": [names of packs rewritten or tombstoned]}``."""
    if fn not in _cold_erasers:
        _cold_erasers.append(fn)


def unregister(fn: Any) -> None:
    """Remove ``fn`` from every registry (tests)."""
    for registry in (_reclaimers, _cold_readers, _cold_verifiers, _cold_erasers):
        with contextlib.suppress(ValueError):
            registry.remove(fn)  # type: ignore[arg-type]


# --- admission ------------------------------------------------------------------------------------


def _reclaim(directory: Path, measured: admission.Admission) -> int:
    deleted = 0
    for fn in list(_reclaimers):
        try:
            deleted += int(fn(directory, measured.missing_bytes, measured.missing_inodes) or 0)
        except Exception as exc:  # noqa: BLE001 - a failed reclaim frees nothing; the write is refused honestly
            log_event("raw_reclaim_failed", logging.WARNING, error=type(exc).__name__)
    return deleted


def admit(directory: Path, size: int, *, owner_id: int, now: datetime | None = None) -> admission.Admission:
    """Disk admission for one write of ``size`` bytes under ``directory`` (module docstring,
    step 1a). Returns the admitted measurement; raises ``storage_full`` (with ``reason``
    ``bytes`` or ``inodes``) when the write is refused after one reclaim."""
    measured = admission.check(directory, size)
    if measured.refused:
        reclaimed = _reclaim(directory, measured) if _reclaimers else 0
        log_event("raw_admission_refused", reason=measured.reason, reclaimers=len(_reclaimers), reclaimed=reclaimed)
        measured = admission.check(directory, size)
        if measured.refused:
            raise YimiError(
                "storage_full", "the server's disk is too full: this original was not stored",
                reason=measured.reason, free_bytes=measured.free.bytes, free_inodes=measured.free.inodes,
                reserve_bytes=settings.DISK_RESERVE_BYTES, reserve_inodes=settings.DISK_RESERVE_INODES,
            )
    if measured.tight:
        warn_owner(owner_id, measured, now=now)
    return measured


def _announce(owner_id: int, entry: TimelineEntry) -> None:
    try:
        push.announce_sync(owner_id, seq=entry.seq, code=entry.notice_code, text=entry.text)
    except Exception as exc:  # noqa: BLE001 - the entry is committed; devices catch up with sync
        log_event("raw_notice_push_failed", logging.WARNING, seq=entry.seq, error=type(exc).__name__)


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB"


def warn_owner(owner_id: int, measured: admission.Admission, *, now: datetime | None = None) -> TimelineEntry | None:
    """Space is tight but writes are still admitted: tell the owner before anything is
    refused, at most once per ``RAW_NOTICE_INTERVAL_SECONDS`` (the last such notice on the
    timeline is the rate limit's memory). Returns the new entry, or None when one was given
    recently."""
    now = now or timezone.now()
    since = now - timedelta(seconds=settings.RAW_NOTICE_INTERVAL_SECONDS)
    if TimelineEntry.objects.filter(owner_id=owner_id, notice_code=NOTICE_STORAGE_LOW, created_at__gt=since).exists():
        return None
    text = (
        f"The server's disk is nearly full: {_gib(measured.free.bytes)} and {measured.free.inodes:,} inodes free. "
        f"Below {_gib(settings.DISK_RESERVE_BYTES)} or {settings.DISK_RESERVE_INODES:,} inodes Yimi stops storing new "
        "recordings, images and events (older originals already copied to cold storage are removed first)."
    )
    entry = timeline.append_entry(owner_id=owner_id, kind=TimelineEntry.Kind.NOTICE, text=text, notice_code=NOTICE_STORAGE_LOW)
    transaction.on_commit(partial(_announce, owner_id, entry))
    log_event("raw_storage_low", free_bytes=measured.free.bytes, free_inodes=measured.free.inodes, seq=entry.seq)
    return entry


KIND_WORDS = {"audio": "Audio", "image": "An image", "sensor": "A sensor event"}


def not_stored(
    capture: Capture, *, kind: str, started_at: datetime, ended_at: datetime, error: YimiError, now: datetime | None = None
) -> TimelineEntry | None:
    """An original was refused: the timeline says so (``original_not_stored``). One entry
    per device per ``NOT_STORED_REPEAT_SECONDS`` (audio is refused batch by batch); the
    entry says that later refusals from that device within that time are covered by it.
    Returns the entry, or None when this refusal is covered by a recent one."""
    now = now or timezone.now()
    recent = TimelineEntry.objects.filter(
        owner_id=capture.owner_id, notice_code=NOTICE_NOT_STORED, created_at__gt=now - timedelta(seconds=NOT_STORED_REPEAT_SECONDS),
    )
    recent = recent.filter(device_id=capture.device_id) if capture.device_id is not None else recent.filter(device__isnull=True)
    if recent.exists():
        return None
    reason = error.details.get("reason", "bytes")
    what = "free space" if reason == "bytes" else "free inodes (files)"
    source = f"{capture.device_label or 'device'} / {capture.channel}"
    text = (
        f"{KIND_WORDS.get(kind, kind)} from {started_at:%H:%M:%S} to {ended_at:%H:%M:%S} UTC ({source}): "
        f"this original was not stored, the server's disk has too little {what} left. "
        f"Whatever else this device sends in the next {NOT_STORED_REPEAT_SECONDS} s may not be stored either; "
        "Yimi says so again after that if the disk is still full."
    )
    with transaction.atomic():
        entry = timeline.append_entry(
            owner_id=capture.owner_id, kind=TimelineEntry.Kind.NOTICE, text=text, device_id=capture.device_id,
            notice_code=NOTICE_NOT_STORED,
        )
        transaction.on_commit(partial(_announce, capture.owner_id, entry))
    log_event("raw_original_not_stored", kind=kind, reason=reason, seq=entry.seq)
    return entry


# --- writing ------------------------------------------------------------------------------------


def _make_dirs(directory: Path) -> None:
    """Create ``directory`` and its missing parents, each new name made durable in its parent."""
    missing: list[Path] = []
    probe = directory
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        fsync_dir(path.parent)


def write_durably(path: Path, data: bytes) -> None:
    """``data`` at ``path``: temporary file, fsync, rename, fsync of the directory."""
    _make_dirs(path.parent)
    write_atomically(path, data)


def _check(capture: Capture, kind: str, codec: str, data: bytes, started_at: datetime, ended_at: datetime) -> None:
    if kind not in KINDS:
        raise YimiError("invalid_request", f"kind must be one of {', '.join(sorted(KINDS))}")
    if not codec or len(codec) > 64:
        raise YimiError("invalid_request", "codec names the encoding (at most 64 characters)")
    if not capture.channel or len(capture.channel) > 32:
        raise YimiError("invalid_request", "a capture channel is named like phone_app, glasses, mac")
    if not data:
        raise YimiError("invalid_request", "an original has at least one byte")
    if len(data) > MAX_OBJECT_BYTES:
        raise YimiError("payload_too_large", f"one original is at most {MAX_OBJECT_BYTES} bytes", limit=MAX_OBJECT_BYTES)
    if ended_at < started_at:
        raise YimiError("invalid_request", "an original cannot end before it starts")


def store_original(
    capture: Capture,
    *,
    kind: str,
    codec: str,
    data: bytes,
    started_at: datetime,
    ended_at: datetime,
    stream: str = "",
    stream_offset: int = 0,
    meta: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> RawObject:
    """Store one original durably and index it (module docstring, step 1). Raises
    ``storage_full`` after telling the timeline (``not_stored``) when admission refuses;
    bad input is refused before anything is measured or written."""
    _check(capture, kind, codec, data, started_at, ended_at)
    now = now or timezone.now()
    relative = f"{capture.owner_id}/{kind}/{started_at:%Y-%m-%d}/{uuid.uuid4().hex}.{EXTENSIONS.get(codec, 'bin')}"
    path = hot_root() / relative
    try:
        admit(path.parent, len(data), owner_id=capture.owner_id, now=now)
    except YimiError as exc:
        if exc.code == "storage_full":
            entry = not_stored(capture, kind=kind, started_at=started_at, ended_at=ended_at, error=exc, now=now)
            exc.details["seq"] = entry.seq if entry is not None else None
        raise
    write_durably(path, data)
    try:
        obj = RawObject.objects.create(
            owner_id=capture.owner_id, device_id=capture.device_id, channel=capture.channel, kind=kind, codec=codec,
            stream=stream[:64], stream_offset=stream_offset, meta=meta or {}, started_at=started_at, ended_at=ended_at,
            size=len(data), sha256=hashlib.sha256(data).hexdigest(), hot_path=relative,
        )
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        raise
    log_event("raw_stored", kind=kind, size=len(data), raw_id=obj.pk)
    return obj


def archive_event(capture: Capture, name: str, payload: dict[str, Any], *, started_at: datetime, ended_at: datetime) -> dict[str, Any]:
    """A sensor event (a health record, a location report) kept as its original: the frame as
    the device sent it, canonical JSON. Returns what the device's acknowledgement says of
    it: ``{"original": "stored", "raw_id": …}``, or ``{"original": "not_stored", "code":
    "storage_full", "seq": …}`` when disk admission refused it (the event itself was
    accepted; only its original is missing, and the timeline says so)."""
    data = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str).encode()
    try:
        obj = store_original(
            capture, kind=RawObject.Kind.SENSOR, codec="application/json", data=data, started_at=started_at,
            ended_at=max(ended_at, started_at), meta={"event": name[:64]},
        )
    except YimiError as exc:
        if exc.code != "storage_full":
            raise
        return {"original": "not_stored", "code": exc.code, "seq": exc.details.get("seq")}
    return {"original": "stored", "raw_id": obj.pk}


# --- archive batches ----------------------------------------------------------------------------


@dataclass
class Batch:
    """Audio frames gathered for one archive write."""

    start_sample: int  # stream position of the first sample
    started_at: datetime  # wall clock of the first frame's arrival
    ended_at: datetime  # wall clock of the last frame's arrival
    frames: int
    data: bytes = field(repr=False)

    @property
    def end_sample(self) -> int:
        return self.start_sample + len(self.data) // 2


class ArchiveBatcher:
    """Gather one stream's PCM frames into archive batches (a batch closes at 500 ms, 20
    frames or 64 KiB, whichever comes first). ``add`` returns the batch that a threshold completed, or
    None; ``due`` returns the gathered batch once ``max_seconds`` passed since its first
    frame (the socket calls it from a timer, so a pause in speech does not hold audio
    back); ``flush`` returns whatever is gathered. ``clock`` (seconds) is injected; ``wall``
    gives the datetimes recorded with the batch."""

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        wall: Callable[[], datetime] = timezone.now,
        max_seconds: float = 0.5,
        max_frames: int = 20,
        max_bytes: int = 64 * 1024,
        start_sample: int = 0,
    ) -> None:
        self.clock, self.wall = clock, wall
        self.max_seconds, self.max_frames, self.max_bytes = max_seconds, max_frames, max_bytes
        self.position = start_sample  # stream sample where the gathered data begins
        self._parts: list[bytes] = []
        self._size = 0
        self._opened: float | None = None
        self._started_at: datetime | None = None
        self._last_at: datetime | None = None

    @property
    def pending_bytes(self) -> int:
        return self._size

    def seconds_left(self) -> float | None:
        """Seconds until the gathered batch is due by time, None when nothing is gathered."""
        if self._opened is None:
            return None
        return max(0.0, self.max_seconds - (self.clock() - self._opened))

    def add(self, frame: bytes) -> Batch | None:
        if self._opened is None:
            self._opened, self._started_at = self.clock(), self.wall()
        self._parts.append(frame)
        self._size += len(frame)
        self._last_at = self.wall()
        if (
            len(self._parts) >= self.max_frames
            or self._size >= self.max_bytes
            or self.clock() - self._opened >= self.max_seconds
        ):
            return self.flush()
        return None

    def due(self) -> Batch | None:
        if self._opened is not None and self.clock() - self._opened >= self.max_seconds:
            return self.flush()
        return None

    def flush(self) -> Batch | None:
        if not self._parts:
            return None
        assert self._started_at is not None and self._last_at is not None
        batch = Batch(self.position, self._started_at, self._last_at, len(self._parts), b"".join(self._parts))
        self.position = batch.end_sample
        self._parts, self._size, self._opened, self._started_at, self._last_at = [], 0, None, None, None
        return batch


def store_batch(capture: Capture, batch: Batch, *, stream: str, now: datetime | None = None) -> RawObject:
    """One archive batch of 16 kHz 16-bit mono PCM as an original. Its time range is the
    audio's own: it ends when its last frame arrived and lasts as long as its samples."""
    duration = timedelta(seconds=(len(batch.data) // 2) / (PCM_BYTES_PER_SECOND // 2))
    ended = max(batch.ended_at, batch.started_at)
    return store_original(
        capture, kind=RawObject.Kind.AUDIO, codec=PCM_CODEC, data=batch.data, started_at=ended - duration, ended_at=ended,
        stream=stream, stream_offset=batch.start_sample, meta={"frames": batch.frames}, now=now,
    )


# --- reading ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Original:
    object: RawObject
    data: bytes
    source: str  # hot | cold


def read_original(obj: RawObject) -> Original:
    """The original's bytes (module docstring, step 3). ``original_erased`` for an erased
    one; ``original_unavailable`` when neither copy can be read (with ``reason``)."""
    if obj.erased_at is not None:
        raise YimiError("original_erased", "this original was erased")
    if obj.hot_deleted_at is None:
        try:
            data = hot_file(obj).read_bytes()
        except FileNotFoundError:
            data = b""
        if data and hashlib.sha256(data).hexdigest() == obj.sha256:
            return Original(obj, data, "hot")
        log_event("raw_hot_copy_bad", logging.WARNING, raw_id=obj.pk, found=bool(data))
    if not _cold_readers:
        raise YimiError("original_unavailable", "the hot copy is gone and no cold store is configured", reason="no_cold_store")
    for reader in list(_cold_readers):
        cold = reader(obj)
        if cold is not None:
            if hashlib.sha256(cold).hexdigest() != obj.sha256:
                raise YimiError("original_unavailable", "the cold copy does not match the original", reason="cold_mismatch")
            return Original(obj, cold, "cold")
    raise YimiError("original_unavailable", "the hot copy is gone and there is no cold copy", reason="no_cold_copy")


def restore_hot_copy(obj: RawObject, *, now: datetime | None = None) -> Original:
    """Put the hot copy of ``obj`` back from its cold copy (``manage.py archive restore``):
    read it (one range read, checked against the original's SHA-256), disk admission like
    any write (``storage_full`` changes nothing), written durably at its old hot path, then
    ``hot_deleted_at`` cleared. An intact hot copy is left as it is (``source`` ``hot``).
    The restored copy stays until erasure or an emergency reclaim asks the pack again: its
    pack was already released, so retention does not take it a second time."""
    obj.refresh_from_db()
    original = read_original(obj)  # original_erased / original_unavailable before anything is written
    if original.source == "hot":
        return original
    path = hot_file(obj)
    admit(path.parent, len(original.data), owner_id=obj.owner_id, now=now)
    write_durably(path, original.data)
    if not RawObject.objects.filter(pk=obj.pk, erased_at__isnull=True).update(hot_deleted_at=None):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # erased meanwhile: the copy must not outlive the erasure
        raise YimiError("original_erased", "this original was erased")
    obj.hot_deleted_at = None
    log_event("raw_hot_copy_restored", raw_id=obj.pk, size=len(original.data))
    return original


# --- deleting hot copies ------------------------------------------------------------------------------


def verified_cold(ids: Sequence[int]) -> set[int]:
    """The ids whose cold copy every registered verifier vouches for; empty without one."""
    if not _cold_verifiers or not ids:
        return set()
    verified = set(ids)
    for fn in list(_cold_verifiers):
        verified &= set(fn(list(ids)))
    return verified


def delete_hot_copies(ids: Iterable[int], *, reason: str, now: datetime | None = None) -> list[int]:
    """Delete the hot copies of ``ids`` that have a verified cold copy (``verified_cold``);
    any other id is left alone. Compare-and-set on ``hot_deleted_at`` (a second caller
    deletes nothing twice); the file goes after the row is marked. Returns the ids deleted."""
    wanted = list(dict.fromkeys(int(i) for i in ids))
    verified = verified_cold(wanted)
    skipped = len(wanted) - len(verified)
    if skipped:
        log_event("raw_hot_delete_skipped_unverified", reason=reason, skipped=skipped)
    now = now or timezone.now()
    deleted: list[int] = []
    for obj in RawObject.objects.filter(id__in=verified, hot_deleted_at__isnull=True).only("id", "hot_path"):
        if RawObject.objects.filter(id=obj.pk, hot_deleted_at__isnull=True).update(hot_deleted_at=now):
            with contextlib.suppress(FileNotFoundError):
                hot_file(obj).unlink()
            deleted.append(obj.pk)
    if deleted:
        log_event("raw_hot_copies_deleted", reason=reason, count=len(deleted))
    return deleted


# --- erasure ----------------------------------------------------------------------------------------------


def erase_originals(owner_id: int, ids: Iterable[int], *, now: datetime | None = None) -> dict[str, Any]:
    """Erase the owner's originals ``ids`` (module docstring, step 5). Another owner's ids
    and ids already erased are not touched and are listed as ``not_found``.

    Steps: 1. mark the rows erased (compare-and-set on ``erased_at``) and the hot copies
    deleted, in one transaction; 2. after commit, delete the hot files; 3. ask the cold
    side to rewrite or tombstone its packs. The result says what was erased (hot files,
    cold copies) and what remains: cold copies still waiting for their pack's rewrite
    (``cold_pending``; all of them when no cold eraser is registered but cold copies may
    exist) and backups, which this does not reach."""
    now = now or timezone.now()
    wanted = list(dict.fromkeys(int(i) for i in ids))
    rows: list[RawObject] = []
    with transaction.atomic():
        for i in range(0, len(wanted), ERASE_CHUNK):  # PostgreSQL takes at most 65,535 parameters per query
            chunk = list(
                RawObject.objects.select_for_update().filter(owner_id=owner_id, id__in=wanted[i : i + ERASE_CHUNK], erased_at__isnull=True)
            )
            RawObject.objects.filter(id__in=[o.pk for o in chunk]).update(erased_at=now, hot_deleted_at=Coalesce("hot_deleted_at", Value(now)))
            rows += chunk
        hot = [o for o in rows if o.hot_deleted_at is None]
        paths = [hot_file(o) for o in hot]

        def remove() -> None:
            for path in paths:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

        transaction.on_commit(remove)
    found = {o.pk for o in rows}
    cold: dict[str, Any] = {"erased": [], "pending": [], "packs": []}
    if rows and _cold_erasers:
        for fn in list(_cold_erasers):
            answer = fn(owner_id, rows)
            cold["packs"] = sorted({*cold["packs"], *answer.get("packs", [])})
            for key in ("erased", "pending"):
                cold[key] = sorted({*cold[key], *(i for i in answer.get(key, []) if i in found)})
    elif rows:
        # No eraser: every cold copy stays. A hot copy already gone had a verified cold one.
        had_cold = {o.pk for o in rows if o.hot_deleted_at is not None} | verified_cold(sorted(found))
        cold["pending"] = sorted(had_cold)
    result = {
        "erased": sorted(found),
        "hot_files_deleted": sorted(o.pk for o in hot),
        "cold_erased": cold["erased"],
        "cold_pending": cold["pending"],
        "cold_packs": cold["packs"],
        "not_found": sorted(set(wanted) - found),
        "remains": [
            "backups of the server's data directory made before now still hold these originals",
            *(["cold copies listed in cold_pending, until their packs are rewritten"] if cold["pending"] else []),
        ],
    }
    log_event("raw_originals_erased", count=len(found), hot=len(hot), cold_pending=len(cold["pending"]))
    return result
