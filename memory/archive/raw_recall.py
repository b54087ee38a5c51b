"""Recall's L5 layer (flow F7): find the original a question points at — an audio segment
or an image — by time and source, and fetch it (docs/memory.md "Raw store (L5)").

1. **When** (``window``): "刚才 / just now" → the last ``RECENT_SECONDS`` (15 min); "今天 /
   today" → since local midnight; "昨天 / yesterday" → the local day before; otherwise the
   last ``DEFAULT_SECONDS`` (24 h). **Where from** (``source_channels``): "眼镜 / glasses",
   "手机 / phone", "Mac / 电脑" name capture channels; none named → every channel. **What**
   (``kinds``): seeing words (看到, 照片, 招牌, photo, sign) → images first; hearing words
   (听到, 录音, 说, heard) → audio first; both or neither → both.
2. **Candidates**: the owner's originals in the window from those channels, not erased.
   Audio batches of one stream that follow each other (no gap over ``JOIN_GAP_SECONDS``)
   join into one segment of at most ``SEGMENT_MAX_OBJECTS`` batches (about 30 s); each
   segment carries what the ambient log heard on the same channel meanwhile.
3. **Ranking**: reciprocal rank fusion (``memory.recall.rrf``) of two lists — newest first
   (the preferred kind before the other), and, when the question has search terms, the
   segments whose overheard words contain them. At most 100 per list.
4. **Fetch**: each of the top ``limit`` is read (``memory.archive.raw_store.read_original``): from
   the hot store, else by one range read from its cold pack, else it is reported
   ``available: false`` with the reason — never left out silently, never made up.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from memory.archive import raw_store
from memory.archive.models import RawObject
from memory.personal.models import AmbientRecord
from yimi_project.errors import YimiError

RECENT_SECONDS = 15 * 60
DEFAULT_SECONDS = 24 * 3600
JOIN_GAP_SECONDS = 1.0
SEGMENT_MAX_OBJECTS = 64
MAX_CANDIDATES = 2_000  # originals read from the index per question
LIST_MAX = 100

RECENT = re.compile(r"刚才|刚刚|方才|\b(just now|a moment ago|earlier)\b")
TODAY = re.compile(r"今天|今早|\b(today|this morning)\b")
YESTERDAY = re.compile(r"昨天|昨晚|\b(yesterday|last night)\b")
SEEING = re.compile(r"看到|看见|画面|照片|图片|拍的|招牌|视频|\b(saw|see|seen|photo|picture|image|sign|look)\b")
HEARING = re.compile(r"听到|听见|录音|说的|说了|讲的|\b(heard|hear|recording|said|say)\b")
CHANNELS = (
    (re.compile(r"眼镜|\bglasses\b"), "glasses"),
    (re.compile(r"手机|\bphone\b"), "phone_app"),
    (re.compile(r"电脑|\bmac\b|\blaptop\b"), "mac"),
)


def _normalized(question: str) -> str:
    return unicodedata.normalize("NFKC", question).lower()


def window(question: str, now: datetime) -> tuple[datetime, datetime]:
    text = _normalized(question)
    if RECENT.search(text):
        return now - timedelta(seconds=RECENT_SECONDS), now
    local = timezone.localtime(now)
    midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
    if YESTERDAY.search(text):
        return midnight - timedelta(days=1), midnight
    if TODAY.search(text):
        return midnight, now
    return now - timedelta(seconds=DEFAULT_SECONDS), now


def source_channels(question: str) -> list[str]:
    text = _normalized(question)
    return [channel for pattern, channel in CHANNELS if pattern.search(text)]


def kinds(question: str) -> list[str]:
    """The kinds to look at, preferred first."""
    text = _normalized(question)
    seeing, hearing = bool(SEEING.search(text)), bool(HEARING.search(text))
    if hearing and not seeing:
        return ["audio", "image"]
    return ["image", "audio"]


@dataclass
class Found:
    """One original as recall reports it: an image, or an audio segment (several batches)."""

    kind: str
    objects: list[RawObject]
    heard: list[str] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> int:
        return self.objects[0].pk

    @property
    def ended_at(self) -> datetime:
        return self.objects[-1].ended_at

    def payload(self) -> dict[str, Any]:
        first, last = self.objects[0], self.objects[-1]
        return {
            "kind": self.kind, "object_ids": [o.pk for o in self.objects], "device_id": str(first.device_id) if first.device_id else None,
            "channel": first.channel, "codec": first.codec, "started_at": first.started_at.isoformat(),
            "ended_at": last.ended_at.isoformat(), "bytes": sum(o.size for o in self.objects), "heard": self.heard, **self.status,
        }


def _segments(rows: list[RawObject]) -> list[Found]:
    found: list[Found] = []
    open_by_stream: dict[tuple[str, Any, str], Found] = {}
    for row in sorted(rows, key=lambda r: (r.started_at, r.stream_offset)):
        if row.kind != RawObject.Kind.AUDIO:
            found.append(Found(row.kind, [row]))
            continue
        key = (row.stream, row.device_id, row.channel)
        current = open_by_stream.get(key)
        if (
            current is not None
            and row.stream
            and len(current.objects) < SEGMENT_MAX_OBJECTS
            and (row.started_at - current.ended_at).total_seconds() <= JOIN_GAP_SECONDS
        ):
            current.objects.append(row)
            continue
        current = open_by_stream[key] = Found(row.kind, [row])
        found.append(current)
    return found


def _attach_heard(owner_id: int, found: list[Found]) -> None:
    """What the ambient log heard on the segment's device and channel while it was recorded."""
    audio = [f for f in found if f.kind == RawObject.Kind.AUDIO]
    if not audio:
        return
    start = min(f.objects[0].started_at for f in audio) - timedelta(seconds=10)
    end = max(f.ended_at for f in audio)
    records = list(
        AmbientRecord.objects.filter(owner_id=owner_id, heard_at__gte=start, heard_at__lte=end)
        .order_by("heard_at").only("heard_at", "device_id", "channel", "text", "stream_start_sample", "stream_end_sample")[:LIST_MAX * 4]
    )
    for segment in audio:
        first = segment.objects[0]
        seg_start, seg_end = first.started_at, segment.ended_at
        for record in records:
            length = timedelta(seconds=(record.stream_end_sample - record.stream_start_sample) / 16_000)
            if (
                record.channel == first.channel
                and (first.device_id is None or record.device_id == first.device_id)
                and record.heard_at < seg_end
                and record.heard_at + length > seg_start
                and record.text not in segment.heard
            ):
                segment.heard.append(record.text)


def fetch(found: Found, reader: Callable[[RawObject], raw_store.Original] = raw_store.read_original) -> dict[str, Any]:
    """Read every object of one found original; what recall says of it."""
    sources: set[str] = set()
    size = 0
    for obj in found.objects:
        try:
            original = reader(obj)
        except YimiError as exc:
            return {"available": False, "unavailable": exc.details.get("reason", exc.code), "message": exc.message}
        sources.add(original.source)
        size += len(original.data)
    return {"available": True, "source": sources.pop() if len(sources) == 1 else "mixed", "fetched_bytes": size}


def search_originals(
    owner_id: int, question: str, terms: list[tuple[str, float]], rrf: Callable[..., list[tuple[int, float]]],
    *, now: datetime | None = None, limit: int = 5,
) -> list[dict[str, Any]]:
    """The originals a question points at, best first, each fetched (module docstring)."""
    now = now or timezone.now()
    since, until = window(question, now)
    rows = RawObject.objects.filter(owner_id=owner_id, erased_at__isnull=True, started_at__lt=until, ended_at__gte=since)
    channels = source_channels(question)
    if channels:
        rows = rows.filter(channel__in=channels)
    found = _segments(list(rows.order_by("-started_at")[:MAX_CANDIDATES]))
    if not found:
        return []
    _attach_heard(owner_id, found)
    order = kinds(question)
    by_key = {f.key: f for f in found}
    newest = [f.key for f in sorted(found, key=lambda f: (order.index(f.kind) if f.kind in order else 9, -f.ended_at.timestamp()))]
    lists = [newest]
    if terms:
        scored = [(sum(w for t, w in terms if t in " ".join(f.heard).lower()), f) for f in found if f.heard]
        lists.append([f.key for score, f in sorted(scored, key=lambda s: (-s[0], -s[1].ended_at.timestamp())) if score > 0])
    ranked = rrf(lists, per_list=LIST_MAX)
    out = []
    for key, score in ranked[:limit]:
        item = by_key[key]
        item.status = fetch(item)
        out.append({**item.payload(), "score": round(score, 6)})
    return out
