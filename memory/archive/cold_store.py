"""Cold packs: moving originals from the hot store to WebDAV, proving each copy, and only then
letting hot copies go (flow F7 of docs/architecture.md; docs/memory.md "Cold packs": the format, the
limits per round and the hot copies' retention). The only writer of
``ColdPack``, ``ObjectLocation`` and ``ColdAlert``; hot copies are deleted only through
``memory.archive.raw_store.delete_hot_copies``.

A **migration round** (``migrate_round``, the ``archive_round`` Celery task every minute):

1. one round at a time (``locks.archive_round_lock``); packs a crashed round left ``sealed``
   are marked failed (their objects never got a location, so they are candidates again);
2. discover at most ``MAX_CANDIDATES`` (8,192) originals with a hot copy and no verified
   cold copy, oldest first;
3. before each pack: stop when the soft work budget (5 s on the injected ``clock``) is
   spent, when the owner is in a call (an open ``accounts.VoiceCall``) or a registered busy
   check says so (push-to-talk; ``register_busy_check``), or when ``COLD_MAX_UPLOAD_KBPS``
   says the previous pack's start was too recent (the next start waits ``size × 8 /
   kbps`` after the previous one: start spacing, not a socket throttle). At most
   ``MAX_PACKS`` (2) packs per round. A pack already started is finished;
4. seal: add originals (each read from its hot file and checked against its SHA-256) until
   the pack reaches ``SEAL_BYTES`` (about 8 MiB), ``MAX_OBJECTS`` (2,048), the next one would
   not fit (64 MiB decoded, 80 MiB on the wire), or the budget is spent (a smaller pack);
5. upload (PUT), then **read the whole pack back**: its SHA-256, then every chunk decoded and
   checked against the header and the original's SHA-256. Only then, in one transaction,
   the pack becomes ``verified`` and its ``ObjectLocation`` rows are written. An upload that
   fails (the server gone mid-round) marks the pack failed and ends the round; nothing of
   the hot store changed, so the objects go into a pack of a later round. A verification
   that fails also raises an alert (``ColdAlert`` + log) and ends the round too.

**Release** (``release_due``, after each round): a verified pack whose newest original is
older than ``COLD_HOT_RETENTION_SECONDS`` (2 days) is downloaded and verified again;
passing, its ``reverified_at`` is set and its hot copies are deleted; failing, the pack is
failed, an alert raised, none of its hot copies deleted and its locations dropped (its
originals are packed again). Emergency reclaim (``reclaim``, registered with the hot store)
does the same early, oldest pack first, and raises an alert saying so. The hot store asks
``verified_ids`` before deleting anything: only objects whose pack passed its second
verification in the same ``release_pack`` call.

**Reading** one original (``read_object``) is one HTTP range request for its chunk.
**Erasure** (``erase_cold``) rewrites each pack holding an erased original without it (or
deletes the file when nothing else is left), proves the new pack like any other, and says
what was erased and what is still pending (the cold storage unreachable: a later round
finishes it).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max, Sum
from django.utils import timezone

from accounts.models import VoiceCall
from memory import locks
from memory.archive import admission, coldpack, raw_store
from memory.archive.models import ColdAlert, ColdPack, ObjectLocation, RawObject
from memory.archive.webdav import WebDAV
from memory.archive.webdav import client as webdav_client
from memory.archive.webdav import configured as webdav_configured
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

MAX_PACKS = 2
MAX_OBJECTS = 2048
SEAL_BYTES = 8 * 1024 * 1024
MAX_CANDIDATES = 8192
BUDGET_SECONDS = 5.0
RELEASES_PER_ROUND = 2
COLLECTION = "l5"

Clock = Callable[[], float]
Now = Callable[[], datetime]
# owner id -> a reason no new pack may start now ("push_to_talk"), or None.
BusyCheck = Callable[[int], "str | None"]
_busy_checks: list[BusyCheck] = []


def register_busy_check(fn: BusyCheck) -> None:
    """Layers above memory (the voice socket's push-to-talk) say when no pack may start."""
    if fn not in _busy_checks:
        _busy_checks.append(fn)


def unregister_busy_check(fn: BusyCheck) -> None:
    if fn in _busy_checks:
        _busy_checks.remove(fn)


def busy_reason(owner_id: int) -> str | None:
    """Why no new pack may start for ``owner_id`` now: an open call, or a busy check."""
    if VoiceCall.objects.filter(owner_id=owner_id, ended_at__isnull=True).exists():
        return "call"
    for fn in list(_busy_checks):
        reason = fn(owner_id)
        if reason:
            return reason
    return None


@dataclass
class RoundReport:
    candidates: int = 0
    packs_verified: list[str] = field(default_factory=list)
    packs_failed: list[str] = field(default_factory=list)
    objects_packed: int = 0
    skipped: list[int] = field(default_factory=list)  # hot copy unreadable or not matching
    # done | budget | busy:<reason> | spacing | packs | round_running | not_configured, or the error
    # code that ended it: cold_storage_unavailable, pack_invalid, ffmpeg_missing, flac_timeout, flac_failed
    stopped: str = "done"
    released: list[str] = field(default_factory=list)
    progress: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "progress"}


# --- alerts and failures ------------------------------------------------------------------------


def raise_alert(owner_id: int, code: str, message: str, pack: ColdPack | None = None) -> ColdAlert:
    """A record the owner and the operator see (admin, ``archive status``) and a log line."""
    alert = ColdAlert.objects.create(owner_id=owner_id, pack=pack, code=code, message=message)
    log_event("archive_alert", logging.WARNING, code=code, pack=str(pack.pk) if pack else None)
    return alert


def _delete_file(dav: WebDAV, pack: ColdPack, now: datetime) -> bool:
    """Delete the pack's file; True when it is gone (or was never there)."""
    try:
        dav.delete(pack.path)
    except YimiError as exc:
        log_event("archive_pack_delete_failed", logging.WARNING, pack=str(pack.pk), error=exc.code)
        return False
    ColdPack.objects.filter(pk=pack.pk).update(file_deleted_at=now)
    return True


def _fail(pack: ColdPack, code: str, detail: str, *, stage: str, alert: bool, now: datetime) -> None:
    """Mark ``pack`` failed (from sealed or verified). A pack whose hot copies were not all
    released loses its locations, so its originals are packed again; a released pack keeps
    them (the cold copy is then the only one: dropping its index would help nobody)."""
    with transaction.atomic():
        ColdPack.objects.filter(pk=pack.pk).exclude(state=ColdPack.State.RETIRED).update(
            state=ColdPack.State.FAILED, failure=code[:40], failure_detail=detail[:2000])
        if pack.released_at is None:
            ObjectLocation.objects.filter(pack=pack).delete()
    log_event("archive_pack_failed", logging.WARNING, pack=str(pack.pk), stage=stage, error=code)
    if alert:
        raise_alert(pack.owner_id, f"verification_failed_{stage}",
                    f"Cold pack {pack.path} failed verification at {stage} ({code}: {detail[:300]}). "
                    "None of its originals' hot copies were deleted.", pack)


# --- verification -----------------------------------------------------------------------------


def verify_bytes(pack: ColdPack, data: bytes, expected: dict[str, str]) -> coldpack.Header:
    """Check a whole downloaded pack: its SHA-256 is the one recorded at sealing, it holds
    exactly the ``expected`` objects (id → original SHA-256), and every chunk decodes to
    bytes of that size and hash. ``pack_invalid`` on the first mismatch."""
    if len(data) != pack.size or hashlib.sha256(data).hexdigest() != pack.sha256:
        raise coldpack.invalid(f"pack is {len(data)} bytes with another SHA-256 than the {pack.size} sealed")
    header = coldpack.decode_header(data)
    found = {c.id: c.sha256 for c in header.chunks}
    if found != expected:
        raise coldpack.invalid("pack holds other objects than recorded")
    for _chunk, _original in coldpack.decode_pack(data):
        pass  # decode_pack checks size and SHA-256 of each chunk
    return header


def _expected(pack: ColdPack) -> dict[str, str]:
    """The objects a verified pack must hold: its locations' originals and their hashes."""
    return {str(oid): sha for oid, sha in ObjectLocation.objects.filter(pack=pack).values_list("object_id", "object__sha256")}


def verify_pack(pack: ColdPack, *, dav: WebDAV, stage: str, now: datetime) -> bool:
    """Download ``pack`` and verify it whole; a failure fails it and raises an alert."""
    try:
        data = dav.get(pack.path)
    except YimiError as exc:
        if exc.code == "not_found":
            _fail(pack, "pack_missing", "the pack file is not on the cold storage", stage=stage, alert=True, now=now)
            return False
        raise
    try:
        verify_bytes(pack, data, _expected(pack))
    except YimiError as exc:
        _fail(pack, exc.code, exc.message, stage=stage, alert=True, now=now)
        return False
    return True


def check_pack(pack_id: str, *, now: Now = timezone.now, dav: WebDAV | None = None,
               progress: Callable[[str], None] = lambda line: None) -> int:
    """An operator's verification of one verified pack (``archive verify``): download it,
    check it whole like the second verification; a failure fails the pack and raises an
    alert as at deletion. Returns the chunks checked; ``not_found`` / ``conflict`` /
    ``pack_invalid``."""
    try:
        pack = ColdPack.objects.get(pk=pack_id)
    except (ColdPack.DoesNotExist, ValueError, ValidationError):
        raise YimiError("not_found", f"no pack {pack_id}") from None
    if pack.state != ColdPack.State.VERIFIED:
        raise YimiError("conflict", f"pack {pack.path} is {pack.state}; only a verified pack is checked again")
    own = dav is None
    dav = dav or webdav_client()
    try:
        progress(f"downloading {pack.path} ({pack.size} bytes, {pack.object_count} originals)")
        if not verify_pack(pack, dav=dav, stage="operator check", now=now()):
            pack.refresh_from_db()
            raise YimiError("pack_invalid", f"pack {pack.path} failed verification: {pack.failure_detail}")
    finally:
        if own:
            dav.close()
    return pack.object_count


# The packs whose second verification the current ``release_pack`` call has just passed.
_reverified: ContextVar[frozenset[Any]] = ContextVar("reverified_packs", default=frozenset())


def verified_ids(ids: Sequence[int]) -> set[int]:
    """The hot store's verifier: ids whose cold copy is in a pack that passed its upload
    verification and, in this very ``release_pack`` call, its second one. Outside such a
    call the answer is empty: nothing else may delete a hot copy."""
    packs = _reverified.get()
    if not packs:
        return set()
    return set(ObjectLocation.objects.filter(
        object_id__in=list(ids), pack__state=ColdPack.State.VERIFIED, pack_id__in=list(packs),
    ).values_list("object_id", flat=True))


# --- the round ---------------------------------------------------------------------------------------


def _hot_bytes(obj: RawObject) -> bytes | None:
    try:
        data = raw_store.hot_file(obj).read_bytes()
    except OSError:
        return None
    return data if hashlib.sha256(data).hexdigest() == obj.sha256 else None


def candidates(owner_id: int, limit: int = MAX_CANDIDATES) -> list[RawObject]:
    """Originals with a hot copy and no verified cold copy, oldest first."""
    return list(RawObject.objects.filter(
        owner_id=owner_id, hot_deleted_at__isnull=True, erased_at__isnull=True, cold_location__isnull=True,
    ).order_by("stored_at", "id").only("id", "codec", "size", "sha256", "hot_path", "stored_at")[:limit])


def next_start_at(owner_id: int) -> datetime | None:
    """When the next pack may start: the previous start plus its size at ``COLD_MAX_UPLOAD_KBPS``."""
    last = ColdPack.objects.filter(owner_id=owner_id).order_by("-started_at").first()
    if last is None or settings.COLD_MAX_UPLOAD_KBPS <= 0:
        return None
    return last.started_at + timedelta(seconds=last.size * 8 / (settings.COLD_MAX_UPLOAD_KBPS * 1000))


def ensure_collections(dav: WebDAV, owner_id: int) -> str:
    dav.mkcol(COLLECTION)
    folder = f"{COLLECTION}/{owner_id}"
    dav.mkcol(folder)
    return folder


def _seal(objs: list[RawObject], start: int, *, seal_bytes: int, over_budget: Callable[[], bool],
          report: RoundReport) -> tuple[coldpack.PackBuilder, int, dict[str, str]]:
    """Fill one pack from ``objs[start:]`` (module docstring, step 4). Originals are read
    and coded in groups (one ffmpeg call for a group's audio: starting ffmpeg costs more
    than coding half a second of it); a group stops once its raw bytes would take the pack
    to ``seal_bytes`` (coding only shrinks them), so a pack passes the seal size by at
    most one group's compressed bytes. Returns the builder, the next index and the
    expected (id → SHA-256) of what went in."""
    builder = coldpack.PackBuilder(max_objects=MAX_OBJECTS)
    expected: dict[str, str] = {}
    index = start
    full = False
    while not full and index < len(objs) and builder.size < seal_bytes and len(builder.chunks) < MAX_OBJECTS:
        group: list[tuple[str, str, bytes]] = []
        raw = 0
        while index < len(objs) and len(group) < coldpack.FFMPEG_GROUP and builder.size + raw < seal_bytes:
            obj = objs[index]
            if (len(builder.chunks) + len(group) >= MAX_OBJECTS
                    or builder.decoded_size + raw + obj.size > coldpack.MAX_DECODED_BYTES):
                if builder.chunks or group:
                    full = True  # the next pack takes it
                    break
                report.skipped.append(obj.pk)  # bigger than any pack may decode to: never packable
                log_event("archive_object_too_large", logging.WARNING, raw_id=obj.pk, size=obj.size)
                index += 1
                continue
            data = _hot_bytes(obj)
            index += 1
            if data is None:
                report.skipped.append(obj.pk)
                log_event("archive_hot_copy_bad", logging.WARNING, raw_id=obj.pk)
                continue
            group.append((str(obj.pk), obj.codec, data))
            raw += len(data)
            expected[str(obj.pk)] = obj.sha256
        if group:
            builder.add_many(group)
        if builder.chunks and over_budget():
            break  # sealed small: the budget is spent
    return builder, index, expected


def _upload_and_verify(dav: WebDAV, owner_id: int, folder: str, builder: coldpack.PackBuilder,
                       expected: dict[str, str], *, now: Now, replaces: ColdPack | None = None) -> ColdPack:
    """Seal, PUT, read back whole and verify, then index (module docstring, step 5).
    Raises ``cold_storage_unavailable`` (pack failed, no alert) or ``pack_invalid`` (pack
    failed, alert raised); either way no location was written."""
    data = builder.seal()
    pack = ColdPack.objects.create(
        owner_id=owner_id, path="", size=len(data), decoded_size=builder.decoded_size, object_count=len(builder.chunks),
        sha256=hashlib.sha256(data).hexdigest(), started_at=now(), members=[int(c.id) for c in builder.chunks],
    )
    pack.path = f"{folder}/{pack.pk}.l5p"
    ColdPack.objects.filter(pk=pack.pk).update(path=pack.path)
    try:
        dav.put(pack.path, data)
        back = dav.get(pack.path)
    except YimiError as exc:
        _fail(pack, exc.code, exc.message, stage="upload", alert=False, now=now())
        if exc.code != "cold_storage_unavailable":
            _delete_file(dav, pack, now())  # unreachable now: cleanup deletes it in a later round
        raise
    try:
        header = verify_bytes(pack, back, expected)
    except YimiError as exc:
        _fail(pack, exc.code, exc.message, stage="upload", alert=True, now=now())
        _delete_file(dav, pack, now())
        raise
    with transaction.atomic():
        updated = ColdPack.objects.filter(pk=pack.pk, state=ColdPack.State.SEALED).update(
            state=ColdPack.State.VERIFIED, verified_at=now(),
            reverified_at=replaces.reverified_at if replaces else None, released_at=replaces.released_at if replaces else None,
        )
        if updated != 1:
            raise YimiError("conflict", "the pack changed state while it was being verified")
        ids = [int(chunk.id) for chunk in header.chunks]
        ObjectLocation.objects.filter(object_id__in=ids).delete()  # a rewrite moves them from the old pack
        ObjectLocation.objects.bulk_create([
            ObjectLocation(object_id=int(chunk.id), pack=pack, offset=header.data_start + chunk.offset, size=chunk.size,
                           codec=chunk.codec, decoded_size=chunk.decoded_size)
            for chunk in header.chunks
        ])
    pack.refresh_from_db()
    log_event("archive_pack_verified", pack=str(pack.pk), objects=pack.object_count, size=pack.size)
    return pack


def _abandon_sealed(owner_id: int, now: datetime) -> None:
    """Packs a crashed round left sealed (the round lock is held: none is in flight)."""
    for pack in ColdPack.objects.filter(owner_id=owner_id, state=ColdPack.State.SEALED):
        _fail(pack, "interrupted", "the round that made this pack ended before verifying it", stage="upload", alert=False, now=now)


def migrate_round(
    owner_id: int,
    *,
    clock: Clock = time.monotonic,
    now: Now = timezone.now,
    dav: WebDAV | None = None,
    budget: float = BUDGET_SECONDS,
    seal_bytes: int = SEAL_BYTES,
    progress: Callable[[str], None] | None = None,
) -> RoundReport:
    """One migration round for the owner (module docstring). Never deletes a hot copy."""
    report = RoundReport()

    def say(line: str) -> None:
        report.progress.append(line)
        if progress is not None:
            progress(line)

    if dav is None and not webdav_configured():
        report.stopped = "not_configured"
        return report
    with locks.archive_round_lock(owner_id) as held:
        if not held:
            report.stopped = "round_running"
            return report
        started = clock()

        def over_budget() -> bool:
            return clock() - started >= budget

        own = dav is None
        dav = dav or webdav_client()
        try:
            _abandon_sealed(owner_id, now())
            objs = candidates(owner_id)
            report.candidates = len(objs)
            say(f"{len(objs)} originals wait for a cold copy")
            index = 0
            try:
                folder = ensure_collections(dav, owner_id) if objs else ""
            except YimiError as exc:
                report.stopped = exc.code
                return report
            while index < len(objs):
                if len(report.packs_verified) + len(report.packs_failed) >= MAX_PACKS:
                    report.stopped = "packs"
                    break
                if over_budget():
                    report.stopped = "budget"
                    break
                reason = busy_reason(owner_id)
                if reason:
                    report.stopped = f"busy:{reason}"
                    break
                after = next_start_at(owner_id)
                if after is not None and now() < after:
                    report.stopped = "spacing"
                    break
                try:
                    builder, index, expected = _seal(objs, index, seal_bytes=seal_bytes, over_budget=over_budget, report=report)
                except YimiError as exc:  # ffmpeg refused or timed out: nothing was uploaded
                    report.stopped = exc.code
                    say(f"sealing failed: {exc.code}: {exc.message}")
                    break
                if not builder.chunks:
                    continue
                say(f"pack {len(report.packs_verified) + len(report.packs_failed) + 1}: {len(builder.chunks)} originals, "
                    f"{builder.decoded_size} bytes -> {builder.size} bytes; uploading")
                try:
                    pack = _upload_and_verify(dav, owner_id, folder, builder, expected, now=now)
                except YimiError as exc:
                    # The storage is down or gave back other bytes: another pack now would fare
                    # no better (and a bad storage would raise an alert a pack).
                    report.packs_failed.append(exc.code)
                    report.stopped = exc.code
                    say(f"pack failed: {exc.code}")
                    break
                report.packs_verified.append(pack.path)
                report.objects_packed += pack.object_count
                say(f"pack {pack.path} verified ({pack.object_count} originals)")
            try:
                report.released = release_due(owner_id, now=now, dav=dav, progress=say)
                cleanup(owner_id, now=now, dav=dav)
            except YimiError as exc:
                say(f"release/cleanup stopped: {exc.code}")
        finally:
            if own:
                dav.close()
    log_event("archive_round", owner=owner_id, **{k: (len(v) if isinstance(v, list) else v) for k, v in report.as_dict().items()})
    return report


# --- release of hot copies ---------------------------------------------------------------------------


def release_pack(pack: ColdPack, *, dav: WebDAV, now: datetime, reason: str) -> list[int]:
    """Verify ``pack`` a second time, then delete the hot copies of its originals (module
    docstring, "Release"). Returns the ids whose hot copy was deleted; none on failure."""
    if pack.state != ColdPack.State.VERIFIED:
        return []
    if not verify_pack(pack, dav=dav, stage="deletion", now=now):
        return []
    ColdPack.objects.filter(pk=pack.pk, state=ColdPack.State.VERIFIED).update(reverified_at=now)
    ids = list(ObjectLocation.objects.filter(pack=pack, object__hot_deleted_at__isnull=True).values_list("object_id", flat=True))
    token = _reverified.set(frozenset({pack.pk}))
    try:
        deleted = raw_store.delete_hot_copies(ids, reason=reason, now=now)
    finally:
        _reverified.reset(token)
    if not ObjectLocation.objects.filter(pack=pack, object__hot_deleted_at__isnull=True).exists():
        ColdPack.objects.filter(pk=pack.pk, released_at__isnull=True).update(released_at=now)
    log_event("archive_pack_released", pack=str(pack.pk), deleted=len(deleted), reason=reason)
    return deleted


def release_due(owner_id: int, *, now: Now = timezone.now, dav: WebDAV, limit: int = RELEASES_PER_ROUND,
                progress: Callable[[str], None] | None = None) -> list[str]:
    """Release up to ``limit`` verified packs whose newest original is past the retention."""
    cutoff = now() - timedelta(seconds=settings.COLD_HOT_RETENTION_SECONDS)
    due = (ColdPack.objects.filter(owner_id=owner_id, state=ColdPack.State.VERIFIED, released_at__isnull=True)
           .annotate(newest=Max("locations__object__stored_at")).filter(newest__lte=cutoff).order_by("started_at")[:limit])
    released = []
    for pack in due:
        deleted = release_pack(pack, dav=dav, now=now(), reason="retention")
        if progress is not None:
            progress(f"pack {pack.path}: verified again, {len(deleted)} hot copies deleted" if deleted or
                     ColdPack.objects.filter(pk=pack.pk, state=ColdPack.State.VERIFIED).exists()
                     else f"pack {pack.path}: failed its second verification; hot copies kept")
        if deleted:
            released.append(pack.path)
    return released


def reclaim(directory: Path, missing_bytes: int, missing_inodes: int, *, now: Now = timezone.now, dav: WebDAV | None = None) -> int:
    """The hot store's reclaimer (``raw_store.register_reclaimer``): delete hot copies early,
    oldest verified pack first, each pack verified again before, an alert for each. Returns
    how many hot copies were deleted."""
    if dav is None and not webdav_configured():
        return 0
    own = dav is None
    dav = dav or webdav_client()
    deleted_count, freed = 0, 0
    try:
        packs = ColdPack.objects.filter(state=ColdPack.State.VERIFIED, released_at__isnull=True).order_by("started_at")
        for pack in packs:
            if freed >= missing_bytes and deleted_count >= missing_inodes:
                break
            deleted = release_pack(pack, dav=dav, now=now(), reason="reclaim")
            if deleted:
                freed += RawObject.objects.filter(id__in=deleted).aggregate(n=Sum("size"))["n"] or 0
                deleted_count += len(deleted)
                raise_alert(pack.owner_id, "hot_copies_deleted_early",
                            f"The disk was nearly full: {len(deleted)} hot copies of pack {pack.path} were deleted before "
                            "their retention ended (the pack was verified again first).", pack)
    finally:
        if own:
            dav.close()
    return deleted_count


# --- reading ------------------------------------------------------------------------------------------


def read_object(obj: RawObject, *, dav: WebDAV | None = None) -> bytes | None:
    """The original's bytes from its cold pack: one HTTP range request for its chunk,
    decoded and checked. None when it has no verified cold copy (the hot store's cold reader)."""
    location = ObjectLocation.objects.filter(object_id=obj.pk, pack__state=ColdPack.State.VERIFIED).select_related("pack").first()
    if location is None:
        return None
    own = dav is None
    dav = dav or webdav_client()
    try:
        data = dav.get_range(location.pack.path, location.offset, location.size)
    finally:
        if own:
            dav.close()
    chunk = coldpack.Chunk(str(obj.pk), location.codec, location.offset, location.size, location.decoded_size, obj.sha256)
    return coldpack.decode_chunk(chunk, data)


# --- erasure --------------------------------------------------------------------------------------------


def _rewrite(pack: ColdPack, erased: set[int], *, dav: WebDAV, now: Now) -> ColdPack | None:
    """A new pack with every chunk of ``pack`` but the erased ones (copied as encoded),
    proven like any upload; None when nothing is left (the file is just deleted)."""
    keep_ids = {int(i) for i in _expected(pack)} - erased
    if not keep_ids:
        return None
    data = dav.get(pack.path)
    verify_bytes(pack, data, _expected(pack))
    header = coldpack.decode_header(data)
    builder = coldpack.PackBuilder(max_objects=MAX_OBJECTS)
    expected: dict[str, str] = {}
    for chunk in header.chunks:
        if int(chunk.id) in keep_ids:
            start = header.data_start + chunk.offset
            builder.add_encoded(chunk.id, chunk.codec, data[start : start + chunk.size], chunk.decoded_size, chunk.sha256)
            expected[chunk.id] = chunk.sha256
    folder = pack.path.rsplit("/", 1)[0]
    return _upload_and_verify(dav, pack.owner_id, folder, builder, expected, now=now, replaces=pack)


def erase_cold(owner_id: int, objects: Sequence[RawObject], *, now: Now = timezone.now, dav: WebDAV | None = None) -> dict[str, Any]:
    """The hot store's cold eraser (``raw_store.register_cold_eraser``): every pack file
    holding one of ``objects`` is rewritten without them (verified packs) or deleted
    (failed or retired leftovers, or a pack left empty). Returns ``{"erased": ids whose
    cold copies are all gone, "pending": ids still in a file (the storage could not be
    reached; a later round finishes), "packs": paths rewritten or deleted}``."""
    ids = {int(o.pk) for o in objects}
    result: dict[str, Any] = {"erased": [], "pending": [], "packs": []}
    if not ids:
        return result
    holding = [p for p in ColdPack.objects.filter(owner_id=owner_id, file_deleted_at__isnull=True).order_by("started_at")
               if ids & set(p.members)]
    if not holding:
        result["erased"] = sorted(ids)
        return result
    if dav is None and not webdav_configured():
        result["pending"] = sorted(ids & {m for p in holding for m in p.members})
        return result
    own = dav is None
    dav = dav or webdav_client()
    pending: set[int] = set()
    try:
        for pack in holding:
            gone = ids & set(pack.members)
            all_erased = set(RawObject.objects.filter(id__in=pack.members, erased_at__isnull=False).values_list("id", flat=True))
            try:
                if pack.state != ColdPack.State.VERIFIED and ObjectLocation.objects.filter(pack=pack).exclude(object_id__in=all_erased).exists():
                    # A released pack that later failed a check: the only copy of its other originals.
                    raise YimiError("pack_invalid", "the pack failed verification and still holds the only copy of other originals")
                if pack.state == ColdPack.State.VERIFIED:
                    new = _rewrite(pack, all_erased, dav=dav, now=now)
                    with transaction.atomic():
                        ObjectLocation.objects.filter(pack=pack, object_id__in=all_erased).delete()
                        ColdPack.objects.filter(pk=pack.pk).update(state=ColdPack.State.RETIRED, replaced_by=new)
                    if new is not None:
                        result["packs"].append(new.path)
                if not _delete_file(dav, pack, now()):
                    raise YimiError("cold_storage_unavailable", "the old pack file could not be deleted")
                result["packs"].append(pack.path)
            except YimiError as exc:
                log_event("archive_erasure_pending", logging.WARNING, pack=str(pack.pk), error=exc.code)
                pending |= gone
                if exc.code == "pack_invalid":
                    raise_alert(owner_id, "erasure_pack_invalid",
                                f"Pack {pack.path} holds erased originals but failed verification, so it was not rewritten; "
                                "it is retried every round.", pack)
    finally:
        if own:
            dav.close()
    result["pending"] = sorted(pending)
    result["erased"] = sorted(ids - pending)
    return result


def cleanup(owner_id: int, *, now: Now = timezone.now, dav: WebDAV) -> None:
    """Finish what an unreachable storage left: delete failed and retired packs' files, and
    rewrite packs still holding erased originals."""
    for pack in ColdPack.objects.filter(owner_id=owner_id, file_deleted_at__isnull=True,
                                        state__in=[ColdPack.State.FAILED, ColdPack.State.RETIRED]):
        if not ObjectLocation.objects.filter(pack=pack).exists():  # never the only copy of anything
            _delete_file(dav, pack, now())
    erased = list(RawObject.objects.filter(owner_id=owner_id, erased_at__isnull=False, cold_location__isnull=False))
    if erased:
        erase_cold(owner_id, erased, now=now, dav=dav)


# --- figures -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Status:
    hot_objects: int
    hot_bytes: int
    free_bytes: int
    free_inodes: int
    waiting: int  # originals with a hot copy and no verified cold copy
    packs: dict[str, int]  # pending (sealed), verified, released, failed, retired
    cold_bytes: int
    alerts: int
    configured: bool

    def lines(self) -> list[str]:
        return [
            f"cold storage: {'configured' if self.configured else 'NOT configured (COLD_WEBDAV_URL)'}",
            f"hot: {self.hot_objects} originals, {self.hot_bytes} bytes; disk free {self.free_bytes} bytes, {self.free_inodes} inodes",
            f"waiting for a cold copy: {self.waiting}",
            "packs: " + ", ".join(f"{k} {v}" for k, v in self.packs.items()) + f"; {self.cold_bytes} bytes on the cold storage",
            f"alerts: {self.alerts}",
        ]


def status(owner_id: int | None = None) -> Status:
    raws = RawObject.objects.filter(hot_deleted_at__isnull=True, erased_at__isnull=True)
    packs = ColdPack.objects.all()
    alerts = ColdAlert.objects.all()
    if owner_id is not None:
        raws, packs, alerts = raws.filter(owner_id=owner_id), packs.filter(owner_id=owner_id), alerts.filter(owner_id=owner_id)
    free = admission.measure(raw_store.hot_root())
    counts = {s: packs.filter(state=s).count() for s in ColdPack.State.values}
    return Status(
        hot_objects=raws.count(), hot_bytes=raws.aggregate(n=Sum("size"))["n"] or 0,
        free_bytes=free.bytes, free_inodes=free.inodes,
        waiting=raws.filter(cold_location__isnull=True).count(),
        packs={"pending": counts["sealed"], "verified": counts["verified"],
               "released": packs.filter(state=ColdPack.State.VERIFIED, released_at__isnull=False).count(),
               "failed": counts["failed"], "retired": counts["retired"]},
        cold_bytes=packs.filter(state=ColdPack.State.VERIFIED).aggregate(n=Sum("size"))["n"] or 0,
        alerts=alerts.count(), configured=webdav_configured(),
    )


HOOKS = (reclaim, read_object, verified_ids, erase_cold)


def register() -> None:
    """Hook the cold side into the hot store: its reclaimer, cold reader, verifier, eraser."""
    raw_store.register_reclaimer(reclaim)
    raw_store.register_cold_reader(read_object)
    raw_store.register_cold_verifier(verified_ids)
    raw_store.register_cold_eraser(erase_cold)


def unregister() -> None:
    for fn in HOOKS:
        raw_store.unregister(fn)


def register_if_configured() -> None:
    """``MemoryConfig.ready``: with no cold storage configured there is no cold side (the
    hot store then keeps every hot copy and says an erased original has no cold copy)."""
    if webdav_configured():
        register()
