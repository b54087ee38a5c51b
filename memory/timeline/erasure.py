"""Erasing the owner's timeline (L4) for good: the only code that erases timeline entries.

The ``erasure`` pack reaches it through ``/internal/erasure/`` (``memory.timeline.erasure_views``).
L3 forgetting (``memory.assertions.store.forget``) is a different operation and stays in the
memory pack; erasing never touches assertions.

1. **Preview** (``preview``): the criteria — timeline numbers (``seqs``), a time range
   (``after`` ≤ created < ``before``) and/or a text match (``text``, case-insensitive
   substring), combined with AND, at least one given — select the owner's entries not yet
   erased (at most ``MAX_ENTRIES``; more is ``erasure_too_large``: narrow the criteria).
   The preview lists exactly that set (timeline number, kind, time, an excerpt, the image
   original an ``image`` entry refers to, the embeddings held) and its ``digest`` (SHA-256
   over the entries' numbers, the SHA-256 of their texts and their images, and the L5
   originals). L5 originals (``memory.archive.raw_store``: audio batches, images, sensor events)
   are in the set when the criteria are only a time range with a ``before`` (a range that
   no new recording can enter; at most ``MAX_ORIGINALS``), plus the raw copy of every
   image an erased entry refers to; the preview counts them per kind. It returns a
   ``preview_token``: the owner, the criteria and the digest, signed (``SECRET_KEY``,
   salt ``yimi.erasure.preview``), valid ``TOKEN_TTL_SECONDS``.
2. **Erase** (``erase``), in one transaction under the owner's memory lock:
   a. verify the token (``preview_expired`` / ``invalid_request``; another owner's:
      ``forbidden``);
   b. an erasure already recorded for this token's digest is returned as it was
      (``replayed``), nothing is done twice;
   c. select again by the token's criteria and compare the digest: a different set (an
      entry added, changed or erased since) is ``erasure_changed`` and nothing changes; an
      empty set is ``nothing_to_erase``;
   d. each entry's text becomes empty and ``erased_at`` is set (the row stays: runs,
      deliveries and replies refer to it by key);
   e. every embedding of those entries is deleted (``memory.TimelineEmbedding``, all
      models, which is also where ``llm.vector_index`` keeps the catalog model's index)
      and the process's vector cache is dropped;
   f. every image original an erased ``image`` entry refers to is purged (row kept as a
      tombstone; its files are deleted once the transaction has committed); the selected
      L5 originals are erased (``memory.archive.raw_store.erase_originals``: hot files after
      commit, the cold side asked to rewrite or tombstone its packs);
   g. copies of the erased texts in other apps (the ledger's arguments and results,
      consent card previews, sub-agent goals, the ambient log) are redacted through
      ``memory.copies``, as forgetting does; a redactor that fails rolls everything back;
   h. the result — exactly the timeline numbers, images and embedding rows erased, and
      the copies redacted per place — is stored (``MemoryReceipt`` kind ``erase``, its
      ``request_id`` the digest) and returned.
3. **Result** (``result``): the stored result of an erasure, by its id or its token.

What is not erased: devices that already synced an entry keep their own copy until they
sync again; one-way fingerprints in the ledger stay (they hold no text); backups of the
data directory keep what they hold; cold copies of originals the cold side has not yet
rewritten stay until it does (``originals.cold_pending``).
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core import signing
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from memory import copies, source_changes
from memory.archive import raw_store
from memory.archive.models import RawObject
from memory.assertions.models import MemoryReceipt
from memory.locks import lock_owner_memory
from memory.personal.models import ImageRecord
from memory.timeline.embeddings import clear_vector_cache
from memory.timeline.models import TimelineEmbedding, TimelineEntry
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

MAX_ENTRIES = 500
MAX_ORIGINALS = 200_000  # a day of audio is about 173,000 archive batches
MAX_SEQS = 500
MIN_TEXT_MATCH = 2
EXCERPT = 80
TOKEN_TTL_SECONDS = 600
TOKEN_SALT = "yimi.erasure.preview"
RECEIPT_KIND = "erase"
NAMESPACE = uuid.UUID("0b8c2f4e-57a1-4f36-9d0e-6c1f3a2b9e71")  # erasure ids: uuid5(owner:digest)


@dataclass(frozen=True)
class Criteria:
    seqs: tuple[int, ...] = ()
    after: datetime | None = None
    before: datetime | None = None
    text: str = ""

    def payload(self) -> dict[str, Any]:
        return {
            "seqs": list(self.seqs), "after": self.after.isoformat() if self.after else None,
            "before": self.before.isoformat() if self.before else None, "text": self.text,
        }


@dataclass
class Preview:
    owner_id: int
    criteria: Criteria
    entries: list[dict[str, Any]]
    digest: str
    token: str = ""
    embeddings: int = 0
    images: list[str] = field(default_factory=list)
    originals: list[int] = field(default_factory=list)  # L5 raw object ids
    originals_by_kind: dict[str, int] = field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        return {
            "preview_token": self.token, "digest": self.digest, "count": len(self.entries), "entries": self.entries,
            "images": self.images, "embeddings": self.embeddings, "criteria": self.criteria.payload(),
            "originals": {"count": len(self.originals), "by_kind": self.originals_by_kind},
            "expires_in_seconds": TOKEN_TTL_SECONDS,
        }


def _time(value: Any, name: str) -> datetime | None:
    if value in (None, ""):
        return None
    parsed = parse_datetime(value) if isinstance(value, str) else None
    if parsed is None or parsed.tzinfo is None:
        raise YimiError("invalid_request", f"{name} must be an ISO 8601 time with a time zone")
    return parsed


def parse_criteria(data: Any) -> Criteria:
    """The criteria of a request body, or ``invalid_request`` (nothing is read or changed)."""
    if not isinstance(data, dict):
        raise YimiError("invalid_request", "expected a JSON object")
    seqs = data.get("seqs") or []
    if not isinstance(seqs, list) or len(seqs) > MAX_SEQS or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in seqs):
        raise YimiError("invalid_request", f"seqs must be a list of at most {MAX_SEQS} positive timeline numbers")
    text = data.get("text") or ""
    if not isinstance(text, str) or (text and len(text.strip()) < MIN_TEXT_MATCH) or len(text) > 500:
        raise YimiError("invalid_request", f"text must be {MIN_TEXT_MATCH} to 500 characters")
    criteria = Criteria(tuple(sorted(set(seqs))), _time(data.get("after"), "after"), _time(data.get("before"), "before"), text.strip())
    if not (criteria.seqs or criteria.after or criteria.before or criteria.text):
        raise YimiError("invalid_request", "give timeline numbers (seqs), a time range (after/before) or a text to match")
    if criteria.after and criteria.before and criteria.after >= criteria.before:
        raise YimiError("invalid_request", "after must be earlier than before")
    return criteria


def _select(owner_id: int, criteria: Criteria) -> list[TimelineEntry]:
    rows = TimelineEntry.objects.filter(owner_id=owner_id, erased_at__isnull=True)
    if criteria.seqs:
        rows = rows.filter(seq__in=criteria.seqs)
    if criteria.after:
        rows = rows.filter(created_at__gte=criteria.after)
    if criteria.before:
        rows = rows.filter(created_at__lt=criteria.before)
    if criteria.text:
        rows = rows.filter(text__icontains=criteria.text)
    found = list(rows.order_by("seq")[: MAX_ENTRIES + 1])
    if len(found) > MAX_ENTRIES:
        raise YimiError("erasure_too_large", f"more than {MAX_ENTRIES} entries match: narrow the criteria", limit=MAX_ENTRIES)
    return found


def _describe(owner_id: int, criteria: Criteria, entries: list[TimelineEntry]) -> Preview:
    ids = [e.id for e in entries]
    images = {
        entry_id: str(image_id)
        for image_id, entry_id in ImageRecord.objects.filter(entry_id__in=ids).exclude(state=ImageRecord.State.PURGED).values_list("id", "entry_id")
    }
    listed = []
    digest = hashlib.sha256()
    for e in entries:
        text_hash = hashlib.sha256(e.text.encode("utf-8")).hexdigest()
        digest.update(f"{e.seq}:{text_hash}:{images.get(e.id, '')}\n".encode())
        listed.append({
            "seq": e.seq, "kind": e.kind, "created_at": e.created_at.isoformat(), "excerpt": e.text[:EXCERPT],
            "truncated": len(e.text) > EXCERPT, "image_id": images.get(e.id),
        })
    embeddings = TimelineEmbedding.objects.filter(entry_id__in=ids).count() if ids else 0
    originals = _originals(owner_id, criteria, sorted(images.values()))
    by_kind: dict[str, int] = {}
    for raw_id, kind in originals:
        digest.update(f"raw:{raw_id}\n".encode())
        by_kind[kind] = by_kind.get(kind, 0) + 1
    return Preview(owner_id, criteria, listed, digest.hexdigest(), embeddings=embeddings, images=sorted(images.values()),
                   originals=[raw_id for raw_id, _ in originals], originals_by_kind=by_kind)


def _originals(owner_id: int, criteria: Criteria, image_ids: list[str]) -> list[tuple[int, str]]:
    """The L5 originals an erasure takes (module docstring, step 1): (id, kind), by id."""
    rows = RawObject.objects.filter(owner_id=owner_id, erased_at__isnull=True)
    found: dict[int, str] = {}
    if criteria.before and not criteria.seqs and not criteria.text:
        in_range = rows.filter(started_at__lt=criteria.before)
        if criteria.after:
            in_range = in_range.filter(started_at__gte=criteria.after)
        found.update(in_range.order_by("id").values_list("id", "kind")[: MAX_ORIGINALS + 1])
        if len(found) > MAX_ORIGINALS:
            raise YimiError("erasure_too_large", f"more than {MAX_ORIGINALS} originals are in this range: narrow it", limit=MAX_ORIGINALS)
    if image_ids:
        found.update(rows.filter(kind=RawObject.Kind.IMAGE, meta__image_id__in=image_ids).values_list("id", "kind"))
    return sorted(found.items())


def preview(owner_id: int, data: Any) -> Preview:
    """What an erasure with these criteria would erase, exactly, and its token."""
    criteria = parse_criteria(data)
    result = _describe(owner_id, criteria, _select(owner_id, criteria))
    result.token = signing.dumps({"o": owner_id, "c": criteria.payload(), "d": result.digest}, salt=TOKEN_SALT, compress=True)
    return result


def _token(owner_id: int, token: Any, *, max_age: int | None) -> dict[str, Any]:
    if not isinstance(token, str) or not token or len(token) > 8192:
        raise YimiError("invalid_request", "a preview_token from the preview is needed")
    try:
        claims = signing.loads(token, salt=TOKEN_SALT, max_age=max_age)
    except signing.SignatureExpired:
        raise YimiError("preview_expired", "the preview is too old: preview again") from None
    except signing.BadSignature:
        raise YimiError("invalid_request", "this is not a preview token") from None
    if not isinstance(claims, dict) or claims.get("o") != owner_id:
        raise YimiError("forbidden", "this preview is another owner's")
    return claims


def erasure_id(owner_id: int, digest: str) -> str:
    return str(uuid.uuid5(NAMESPACE, f"{owner_id}:{digest}"))


def erase(owner_id: int, token: Any, *, now: datetime | None = None) -> dict[str, Any]:
    """Erase exactly the previewed set (module docstring, step 2); returns the result."""
    claims = _token(owner_id, token, max_age=TOKEN_TTL_SECONDS)
    digest = str(claims.get("d", ""))
    now = now or timezone.now()
    removed: list[str] = []
    with transaction.atomic():
        lock_owner_memory(owner_id)
        earlier = MemoryReceipt.objects.filter(owner_id=owner_id, kind=RECEIPT_KIND, request_id=digest[:64]).first()
        if earlier is not None:
            return {**earlier.result, "replayed": True}
        criteria = parse_criteria(claims.get("c"))
        entries = _select(owner_id, criteria)
        current = _describe(owner_id, criteria, entries)
        if current.digest != digest:
            raise YimiError(
                "erasure_changed", "what these criteria select changed since the preview: nothing was erased; preview again",
                previewed_digest=digest, current_digest=current.digest, current_count=len(current.entries),
            )
        if not entries and not current.originals:
            raise YimiError("nothing_to_erase", "the preview selected no entries and no originals: nothing was erased")
        ids = [e.id for e in entries]
        texts = [e.text for e in entries if e.text.strip()]
        TimelineEntry.objects.filter(id__in=ids, erased_at__isnull=True).update(text="", erased_at=now)
        embeddings, _ = TimelineEmbedding.objects.filter(entry_id__in=ids).delete()
        images = list(ImageRecord.objects.filter(entry_id__in=ids).exclude(state=ImageRecord.State.PURGED).values_list("id", "path"))
        ImageRecord.objects.filter(id__in=[i for i, _ in images]).update(
            state=ImageRecord.State.PURGED, path="", people=[], purged_at=now
        )
        removed = [p for _, p in images if p]
        originals = raw_store.erase_originals(owner_id, current.originals, now=now) if current.originals else None
        redacted = copies.redact_copies(owner_id, copies.ForgottenContent(texts))
        source_changes.notify(source_changes.SourceChange(owner_id, source_changes.ERASED, entry_ids=tuple(ids)))
        result = {
            "erasure_id": erasure_id(owner_id, digest), "digest": digest, "erased_at": now.isoformat(),
            "entries": [{"seq": e["seq"], "kind": e["kind"], "created_at": e["created_at"]} for e in current.entries],
            "images": current.images, "embeddings": embeddings, "redacted": redacted,
            "originals": _originals_result(originals, current.originals_by_kind),
            "not_erased": [
                "copies devices already synced, until they sync again", "one-way fingerprints in the ledger (they hold no text)",
                *(originals["remains"] if originals else []),
            ],
            "replayed": False,
        }
        MemoryReceipt.objects.create(owner_id=owner_id, request_id=digest[:64], kind=RECEIPT_KIND, fingerprint=digest[:64], result=result)
        transaction.on_commit(lambda: _remove_originals(removed))
    clear_vector_cache()
    log_event("timeline_erased", entries=len(ids), images=len(images), embeddings=embeddings,
              originals=len(current.originals))
    return result


def _originals_result(erased: dict[str, Any] | None, by_kind: dict[str, int]) -> dict[str, Any]:
    """What an erasure says of the L5 originals: counts, and the ids when they are few."""
    if erased is None:
        return {"erased": 0, "by_kind": {}, "hot_files_deleted": 0, "cold_erased": 0, "cold_pending": 0, "cold_packs": []}
    listed = len(erased["erased"]) <= 1000
    return {
        "erased": len(erased["erased"]), "by_kind": by_kind, "hot_files_deleted": len(erased["hot_files_deleted"]),
        "cold_erased": len(erased["cold_erased"]), "cold_pending": len(erased["cold_pending"]), "cold_packs": erased["cold_packs"],
        **({"ids": erased["erased"], "cold_pending_ids": erased["cold_pending"]} if listed else {}),
    }


def _remove_originals(relative_paths: list[str]) -> None:
    for relative in relative_paths:
        path = Path(settings.DATA_DIR) / relative
        for target in (path, path.with_suffix(".json")):
            with contextlib.suppress(FileNotFoundError):
                target.unlink()


def result(owner_id: int, *, erasure: Any = None, token: Any = None) -> dict[str, Any]:
    """The stored result of an erasure, by its id or by the token it was made from."""
    rows = MemoryReceipt.objects.filter(owner_id=owner_id, kind=RECEIPT_KIND)
    if token:
        digest = str(_token(owner_id, token, max_age=None).get("d", ""))
        row = rows.filter(request_id=digest[:64]).first()
    else:
        try:
            wanted = str(uuid.UUID(str(erasure)))
        except ValueError:
            raise YimiError("invalid_request", "give an erasure_id or a preview_token") from None
        row = next((r for r in rows.order_by("-created_at")[:1000] if r.result.get("erasure_id") == wanted), None)
    if row is None:
        raise YimiError("not_found", "no erasure was made from this")
    return {**row.result, "replayed": False}
