"""Images from devices: the only code that writes ``ImageRecord`` and the files under
``DATA_DIR/images/`` (docs/protocol.md "Images").

1. **Upload** (``store_upload``): the bytes are checked before anything is written —
   at most ``IMAGE_MAX_BYTES`` (``image_too_large``), JPEG or PNG by their magic bytes
   (``image_unsupported``), each side at most ``IMAGE_MAX_SIDE`` pixels
   (``image_too_many_pixels``, read from the header before decoding), and a complete
   decode with Pillow (``image_invalid``). Then disk admission (``memory.archive.admission``,
   ``storage_full``), and the original is written (temporary file, fsync, rename) as
   ``images/<owner>/<yyyy-mm>/<id>.jpg|png`` with ``<id>.json`` beside it: its source
   (device, kind, scope, sizes, SHA-256, upload and capture times). State ``uploaded``.
2. **Attach** (``attach_image``, the ``image`` frame): a timeline entry of kind ``image``
   refers to it, with its capture time and the utterance it is about (``about``, the
   client id of a text or voice request); idempotent by the frame's id. Then the image
   analyzers run (``register_image_analyzer``): what they recognize (people the owner
   enrolled) is stored as facts for the vision request.
3. **L5 original** (``archive_image``): an image the owner keeps is also stored as a raw
   original in the hot store (``memory.archive.raw_store``, kind ``image``, ``meta.image_id``), from
   where it moves to a cold pack like any original; disk admission may refuse it (the
   timeline says so) without undoing the attach.
4. **Retention**: an owner's image is kept; a guest's image (a guest device) only until
   the request it served has ended (``release_after_run``), or, unused, until the request
   window has passed (``purge_stale``), unless the owner keeps it (``keep_image``).
   Purging deletes both files and keeps the row as a tombstone (no path, no people).

An erasure of the timeline (``memory.timeline.erasure``) purges the images of the entries
it erases itself, in its own transaction, and deletes their files after it commits.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import re
import uuid
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from memory.archive import raw_store
from memory.archive.admission import admit_write
from memory.archive.models import RawObject
from memory.personal.models import ImageRecord
from memory.timeline import entries as timeline
from memory.timeline.models import TimelineEntry
from yimi_project.errors import YimiError
from yimi_project.files import write_atomically
from yimi_project.ids import uuid_or_nil
from yimi_project.logs import log_event

# The formats a device may send, by their first bytes.
MAGIC = {b"\xff\xd8\xff": ("JPEG", "image/jpeg", "jpg"), b"\x89PNG\r\n\x1a\n": ("PNG", "image/png", "png")}
IMAGES_DIR = "images"


@dataclass(frozen=True)
class ImageInfo:
    format: str  # JPEG or PNG
    content_type: str
    extension: str
    width: int
    height: int


def inspect_image(data: bytes) -> ImageInfo:
    """What the bytes are, or the stable error that refuses them (nothing is written here).

    Steps: 1. size (``image_too_large``); 2. magic bytes (``image_unsupported``); 3. Pillow
    reads the header and must agree on the format (``image_invalid``); 4. each side ≤
    ``IMAGE_MAX_SIDE`` (``image_too_many_pixels``), before any pixel is decoded; 5. a full
    decode (``image_invalid`` for a truncated or corrupt file).
    """
    if len(data) > settings.IMAGE_MAX_BYTES:
        raise YimiError("image_too_large", f"an image is limited to {settings.IMAGE_MAX_BYTES} bytes", limit=settings.IMAGE_MAX_BYTES)
    if not data:
        raise YimiError("image_unsupported", "the body is empty: send the JPEG or PNG bytes")
    kind = next((v for magic, v in MAGIC.items() if data.startswith(magic)), None)
    if kind is None:
        raise YimiError("image_unsupported", "only JPEG and PNG images are accepted")
    fmt, content_type, extension = kind
    from PIL import Image, UnidentifiedImageError  # here: Pillow costs ~0.15 s of a start (test_startup_imports)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=[fmt])
            width, height = image.size
            if width > settings.IMAGE_MAX_SIDE or height > settings.IMAGE_MAX_SIDE:
                raise YimiError(
                    "image_too_many_pixels",
                    f"an image is limited to {settings.IMAGE_MAX_SIDE}×{settings.IMAGE_MAX_SIDE} pixels; this one is {width}×{height}",
                    limit=settings.IMAGE_MAX_SIDE,
                )
            if width < 1 or height < 1:
                raise YimiError("image_invalid", "the image has no pixels")
            image.load()
    except YimiError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise YimiError("image_too_many_pixels", "the image has too many pixels") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError):
        raise YimiError("image_invalid", f"the bytes start like {fmt} but do not decode as a complete image") from None
    return ImageInfo(fmt, content_type, extension, width, height)


def _absolute(relative: str) -> Path:
    return Path(settings.DATA_DIR) / relative


def _remove_files(relative: str) -> None:
    if not relative:
        return
    path = _absolute(relative)
    for target in (path, path.with_suffix(".json")):
        with contextlib.suppress(FileNotFoundError):
            target.unlink()


def store_upload(*, device: Any, scope: str, data: bytes, now: datetime | None = None) -> ImageRecord:
    """Check and store one uploaded image for ``device`` (its owner's store). Returns the
    ``uploaded`` record; raises with a stable code and stores nothing on any refusal."""
    now = now or timezone.now()
    purge_stale(now)
    info = inspect_image(data)
    image_id = uuid.uuid4()
    relative = f"{IMAGES_DIR}/{device.owner_id}/{now:%Y-%m}/{image_id}.{info.extension}"
    path = _absolute(relative)
    digest = hashlib.sha256(data).hexdigest()
    guest = scope != "owner"
    source = {
        "image_id": str(image_id), "owner_id": device.owner_id, "device_id": str(device.id), "device_kind": device.kind,
        "scope": scope, "content_type": info.content_type, "width": info.width, "height": info.height,
        "size_bytes": len(data), "sha256": digest, "uploaded_at": now.isoformat(), "captured_at": None, "about": None,
    }
    sidecar = json.dumps(source, ensure_ascii=False, indent=1).encode()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    admit_write(path.parent, len(data) + len(sidecar))
    write_atomically(path.with_suffix(".json"), sidecar)
    write_atomically(path, data)
    try:
        record = ImageRecord.objects.create(
            id=image_id, owner_id=device.owner_id, device=device, scope=scope,
            retention=ImageRecord.Retention.REQUEST if guest else ImageRecord.Retention.KEEP,
            content_type=info.content_type, width=info.width, height=info.height, size_bytes=len(data),
            sha256=digest, path=relative, uploaded_at=now,
        )
    except BaseException:
        _remove_files(relative)
        raise
    log_event("image_uploaded", image_id=str(image_id), device_id=str(device.id), width=info.width, height=info.height,
              size_bytes=len(data))
    return record


# --- the image frame ---------------------------------------------------------------------------

CLIENT_ID = re.compile(r"^.{1,64}$", re.S)


@dataclass(frozen=True)
class AttachedImage:
    image: ImageRecord
    entry: TimelineEntry
    duplicate: bool


def entry_text(image: ImageRecord) -> str:
    """What the timeline says for an image (no content: its size and format)."""
    return f"[image {image.width}×{image.height} {image.content_type.split('/')[-1]}]"


def attach_image(
    *, device: Any, scope: str, image_id: Any, client_id: str, captured_at: datetime | None,
    about_client_id: str = "", keep: bool | None = None, now: datetime | None = None,
) -> AttachedImage:
    """Announce an uploaded image: a timeline entry (kind ``image``) refers to it.

    Steps: 1. a frame id this device already used returns that image and entry
    (``duplicate``), nothing new; 2. in one transaction, lock the image, which must be this
    device's and ``uploaded`` (``not_found`` otherwise: another device's, unknown, purged,
    or announced by another frame); 3. append the entry and mark the image ``attached``
    with its capture time, ``about`` and retention (``keep: false`` from an owner device
    makes it a request-only image; a guest's image is request-only whatever it asks);
    4. after commit, the analyzers run (``analyze``)."""
    now = now or timezone.now()
    existing = ImageRecord.objects.filter(device=device, client_id=client_id).select_related("entry").first()
    if existing is not None and existing.entry is not None:
        return AttachedImage(existing, existing.entry, True)
    try:
        with transaction.atomic():
            image = ImageRecord.objects.select_for_update().filter(
                id=uuid_or_nil(image_id), device=device, state=ImageRecord.State.UPLOADED
            ).first()
            if image is None:
                raise YimiError("not_found", "there is no uploaded image with this image_id from this device")
            entry = timeline.append_entry(
                owner_id=device.owner_id, kind=TimelineEntry.Kind.IMAGE, text=entry_text(image), device_id=device.id,
                scope=scope,
            )
            image.state, image.client_id, image.entry, image.attached_at = ImageRecord.State.ATTACHED, client_id, entry, now
            image.captured_at, image.about_client_id = captured_at, about_client_id
            if keep is False and scope == "owner":
                image.retention = ImageRecord.Retention.REQUEST
            image.save(update_fields=["state", "client_id", "entry", "attached_at", "captured_at", "about_client_id", "retention"])
    except IntegrityError:
        existing = ImageRecord.objects.filter(device=device, client_id=client_id).select_related("entry").first()
        if existing is None or existing.entry is None:
            raise
        return AttachedImage(existing, existing.entry, True)
    _update_sidecar(image)
    analyze(image)
    archive_image(image)
    return AttachedImage(image, entry, False)


def archive_image(image: ImageRecord) -> int | None:
    """Store a kept, attached image as an L5 original (step 3); returns the raw object's
    id, or None: not kept, not attached, already stored, or refused by disk admission
    (``memory.archive.raw_store`` told the timeline). Idempotent per image."""
    if image.retention != ImageRecord.Retention.KEEP or image.state != ImageRecord.State.ATTACHED or not image.path:
        return None
    if RawObject.objects.filter(owner_id=image.owner_id, kind=RawObject.Kind.IMAGE, meta__image_id=str(image.id)).exists():
        return None
    at = image.captured_at or image.attached_at or image.uploaded_at
    source = raw_store.device_capture(image.device) if image.device is not None else raw_store.Capture(image.owner_id, None, "unknown")
    try:
        obj = raw_store.store_original(
            source, kind=RawObject.Kind.IMAGE, codec=image.content_type, data=read_bytes(image), started_at=at, ended_at=at,
            meta={"image_id": str(image.id), "width": image.width, "height": image.height},
        )
    except YimiError as exc:
        if exc.code != "storage_full":
            raise
        return None
    return obj.pk


def _update_sidecar(image: ImageRecord) -> None:
    path = _absolute(image.path).with_suffix(".json")
    try:
        source = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    source["captured_at"] = image.captured_at.isoformat() if image.captured_at else None
    source["about"] = image.about_client_id or None
    source["timeline_seq"] = image.entry.seq if image.entry else None
    write_atomically(path, json.dumps(source, ensure_ascii=False, indent=1).encode())


# --- analyzers (faces) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredImage:
    """What an analyzer is given: the stored original and where it came from."""

    id: uuid.UUID
    owner_id: int
    device_id: Any
    scope: str
    content_type: str
    width: int
    height: int
    path: Path

    def read(self) -> bytes:
        return self.path.read_bytes()


# An analyzer returns the people it recognized in the image: each a dict with a non-empty
# ``name`` (the name the owner enrolled) and anything else JSON can hold (score, box,
# person id). It never returns a guess for a face it does not know.
ImageAnalyzer = Callable[[StoredImage], Iterable[dict[str, Any]]]
_ANALYZERS: list[ImageAnalyzer] = []


def register_image_analyzer(analyzer: ImageAnalyzer) -> None:
    """Run ``analyzer`` on every image once it is attached (the faces module registers one)."""
    if analyzer not in _ANALYZERS:
        _ANALYZERS.append(analyzer)


def unregister_image_analyzer(analyzer: ImageAnalyzer) -> None:
    with contextlib.suppress(ValueError):
        _ANALYZERS.remove(analyzer)


def stored(image: ImageRecord) -> StoredImage:
    return StoredImage(image.id, image.owner_id, image.device_id, image.scope, image.content_type, image.width,
                       image.height, _absolute(image.path))


def analyze(image: ImageRecord) -> list[dict[str, Any]]:
    """Run every registered analyzer and store the people they recognized on the image.
    With none registered nothing happens. An analyzer that fails is logged and skipped:
    the image stays, without its facts."""
    if not _ANALYZERS or not image.path:
        return []
    people: list[dict[str, Any]] = []
    for analyzer in list(_ANALYZERS):
        try:
            found = list(analyzer(stored(image)))
        except Exception as exc:  # noqa: BLE001 - an analyzer never stops the image from being stored
            log_event("image_analyzer_failed", image_id=str(image.id), error=type(exc).__name__)
            continue
        for person in found:
            name = person.get("name") if isinstance(person, dict) else None
            if isinstance(name, str) and name.strip():
                people.append(json.loads(json.dumps({**person, "name": name.strip()[:64]}, default=str)))
    ImageRecord.objects.filter(id=image.id).update(people=people, analyzed_at=timezone.now())
    image.people = people
    return people


# --- the vision request -----------------------------------------------------------------------

# Words that ask about what the device sees, for a request with no ``about`` link.
ASKS_ABOUT_IMAGE = re.compile(
    r"看看|看一下|看下|瞧瞧|这是什么|这是啥|是什么东西|这是谁|那是什么|认识吗|图里|图片|照片|拍的|眼前|前面是|"
    r"\bwhat(?:'s| is) (?:this|that|it)\b|\bwho(?:'s| is) (?:this|that)\b|\blook at\b|\bphoto\b|\bpicture\b|\bimage\b|\bsee\b",
    re.I,
)


def image_for_request(
    *, device_id: Any, client_id: str | None, text: str, at: datetime, may_be_linked: bool = True
) -> ImageRecord | None:
    """The image a request is about: the latest attached image from the same device whose
    ``about`` is this request's client id; else, when the words ask about something seen
    (``ASKS_ABOUT_IMAGE``), the device's latest image attached within
    ``IMAGE_REQUEST_WINDOW_SECONDS`` before the request. None otherwise.
    ``may_be_linked=False``: the caller has just read that no such linked image exists (the
    runner's claim), so that lookup is skipped."""
    linkable, asks = bool(client_id and may_be_linked), ASKS_ABOUT_IMAGE.search(text or "") is not None
    if not (linkable or asks):
        return None  # on most runs: no query is even built (issue 14)
    usable = ImageRecord.objects.filter(device_id=device_id, state=ImageRecord.State.ATTACHED).exclude(path="")
    if linkable:
        linked = usable.filter(about_client_id=client_id).order_by("-attached_at").first()
        if linked is not None:
            return linked
    if not asks:
        return None
    since = at - timedelta(seconds=settings.IMAGE_REQUEST_WINDOW_SECONDS)
    return usable.filter(attached_at__gte=since, attached_at__lte=at, about_client_id="").order_by("-attached_at").first()


def mark_used(image_id: Any, run_id: Any) -> None:
    ImageRecord.objects.filter(id=image_id).update(used_by_run=run_id)


def read_bytes(image: ImageRecord) -> bytes:
    if not image.path:
        raise YimiError("image_purged", "this image was deleted")
    return _absolute(image.path).read_bytes()


def data_uri(image: ImageRecord) -> str:
    """The image as a ``data:`` URI, for OpenAI-compatible ``image_url`` content."""
    return f"data:{image.content_type};base64,{base64.b64encode(read_bytes(image)).decode('ascii')}"


# --- retention -------------------------------------------------------------------------------------


def purge(image_id: Any, *, reason: str) -> bool:
    """Delete an image's files and keep its row as a tombstone (no path, no people).
    Compare-and-set on the state, so two purges delete once."""
    image = ImageRecord.objects.filter(id=uuid_or_nil(image_id)).exclude(state=ImageRecord.State.PURGED).first()
    if image is None:
        return False
    changed = ImageRecord.objects.filter(id=image.id, state=image.state).update(
        state=ImageRecord.State.PURGED, path="", people=[], purged_at=timezone.now()
    )
    if changed:
        _remove_files(image.path)
        log_event("image_purged", image_id=str(image.id), reason=reason)
    return bool(changed)


def release_after_run(image_id: Any) -> bool:
    """The request an image served has ended: a request-only image (a guest's) is deleted."""
    if ImageRecord.objects.filter(id=image_id, retention=ImageRecord.Retention.REQUEST).exists():
        return purge(image_id, reason="request_ended")
    return False


def keep_image(owner_id: int, image_id: Any) -> bool:
    """The owner asked to keep a request-only image (a guest's): it is kept from now on,
    and becomes an L5 original (``archive_image``)."""
    kept = bool(
        ImageRecord.objects.filter(id=uuid_or_nil(image_id), owner_id=owner_id, retention=ImageRecord.Retention.REQUEST)
        .exclude(state=ImageRecord.State.PURGED)
        .update(retention=ImageRecord.Retention.KEEP)
    )
    if kept:
        image = ImageRecord.objects.select_related("device").get(id=uuid_or_nil(image_id))
        archive_image(image)
    return kept


def purge_stale(now: datetime | None = None) -> int:
    """Uploads no frame announced within ``IMAGE_UPLOAD_TTL_SECONDS``, and request-only
    images that no request used within the request window, are deleted."""
    now = now or timezone.now()
    unannounced = ImageRecord.objects.filter(
        state=ImageRecord.State.UPLOADED, uploaded_at__lt=now - timedelta(seconds=settings.IMAGE_UPLOAD_TTL_SECONDS)
    )
    unused = ImageRecord.objects.filter(
        state=ImageRecord.State.ATTACHED, retention=ImageRecord.Retention.REQUEST, used_by_run__isnull=True,
        attached_at__lt=now - timedelta(seconds=2 * settings.IMAGE_REQUEST_WINDOW_SECONDS),
    )
    count = 0
    for image_id in [*unannounced.values_list("id", flat=True)[:100], *unused.values_list("id", flat=True)[:100]]:
        count += purge(image_id, reason="stale")
    return count
