"""Voiceprints: enrollment per capture channel, scoring, persistent thresholds, learning.

The only code that writes ``VoiceprintEnrollment``, ``VoiceprintSample`` and
``ChannelThreshold``. Embeddings arrive as vectors computed by a voiceprint model named
by its catalog key (``model_key``); nothing here touches audio. The rules and numbers
(bands, enrollment, thresholds that only rise, learning) are docs/voice.md's, "Voice identity".
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from django.conf import settings
from django.db import IntegrityError, transaction

from accounts.models import ChannelThreshold, VoiceprintEnrollment, VoiceprintSample
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

SEGMENT_MIN_VOICED_MS = 1500
SEGMENTS_MIN, SEGMENTS_MAX = 5, 20
LEAVE_ONE_OUT_MIN_COSINE = 0.6
THRESHOLD_FLOOR = 0.65  # verified at or above; the per-channel threshold never goes below
UNCERTAIN_FROM = 0.45  # uncertain from here up to the threshold; unmatched below
LEARNING_MIN_VOICED_MS = 1000
LEARNING_MIN_QUALITY = 0.5
LEARNING_MIN_COSINE = 0.65
# A learning sample (the anchor included) must score at least the uncertain band against the
# channel's enrolled centroid: a trust window vouches for a call, never for a stranger's voice.
LEARNING_MIN_ENROLLED_SCORE = UNCERTAIN_FROM
LEARNING_CAP = 20  # per channel; then learning stops (no rolling replacement)
# Automatic raising (docs/voice.md): with at least 10 confirmed samples on a channel, the
# threshold may rise to (lowest confirmed score − 0.05), by at most 0.05 per step, never
# above 0.85.
RAISE_MIN_CONFIRMED = 10
RAISE_MARGIN = 0.05
RAISE_MAX_STEP = 0.05
RAISE_CEILING = 0.85
CHANNEL_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")

Band = str  # "verified" | "uncertain" | "unmatched"
VERIFIED, UNCERTAIN, UNMATCHED = "verified", "uncertain", "unmatched"


# --- vector math -----------------------------------------------------------------------------


def unit(vector: Sequence[float] | np.ndarray) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float64)
    norm = float(np.linalg.norm(v))
    if v.ndim != 1 or v.size == 0 or not math.isfinite(norm) or norm == 0.0:
        raise YimiError("invalid_embedding", "an embedding is a non-zero vector of finite numbers")
    return v / norm


def cosine(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    ua, ub = unit(a), unit(b)
    if ua.size != ub.size:
        raise YimiError("invalid_embedding", "embeddings of different sizes cannot be compared")
    return float(np.dot(ua, ub))


def weighted_centroid(vectors: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """``c = Σ w_i x̂_i / ‖Σ w_i x̂_i‖`` over unit vectors x̂_i."""
    total = np.zeros_like(vectors[0], dtype=np.float64)
    for v, w in zip(vectors, weights, strict=True):
        total += w * unit(v)
    return unit(total)


def band_of(score: float, threshold: float = THRESHOLD_FLOOR) -> Band:
    if score >= threshold:
        return VERIFIED
    return UNCERTAIN if score >= UNCERTAIN_FROM else UNMATCHED


# --- enrollment ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnrollmentSegment:
    embedding: Sequence[float]
    voiced_ms: int
    quality: float = 1.0

    @property
    def weight(self) -> float:
        return self.voiced_ms * self.quality


def check_enrollment(segments: Sequence[EnrollmentSegment]) -> np.ndarray:
    """Apply the enrollment rules to one channel's segments; returns the centroid.

    Steps: 1. 5 to 20 segments; 2. each with at least 1,500 ms of voiced audio and a
    quality in (0, 1]; 3. embeddings of one size; 4. leave-one-out: each segment against
    the weighted centroid of the others — any cosine below 0.6 rejects the whole set;
    5. the centroid weighted by voiced duration × quality.
    """
    if len(segments) < SEGMENTS_MIN:
        raise YimiError("enrollment_too_few", f"a channel needs at least {SEGMENTS_MIN} segments (got {len(segments)})")
    if len(segments) > SEGMENTS_MAX:
        raise YimiError("enrollment_too_many", f"a channel takes at most {SEGMENTS_MAX} segments (got {len(segments)})")
    for i, seg in enumerate(segments):
        if isinstance(seg.voiced_ms, bool) or not isinstance(seg.voiced_ms, int) or seg.voiced_ms < SEGMENT_MIN_VOICED_MS:
            raise YimiError(
                "enrollment_segment_too_short",
                f"segment {i} has {seg.voiced_ms} ms of voiced audio; each needs at least {SEGMENT_MIN_VOICED_MS} ms",
                segment=i,
            )
        if not (0.0 < float(seg.quality) <= 1.0):
            raise YimiError("enrollment_invalid", f"segment {i}: quality must be in (0, 1]", segment=i)
    vectors = [unit(seg.embedding) for seg in segments]
    if len({v.size for v in vectors}) != 1:
        raise YimiError("enrollment_invalid", "all segments must come from the same voiceprint model")
    weights = [seg.weight for seg in segments]
    for i, v in enumerate(vectors):
        others = weighted_centroid(vectors[:i] + vectors[i + 1 :], weights[:i] + weights[i + 1 :])
        cos = float(np.dot(v, others))
        if cos < LEAVE_ONE_OUT_MIN_COSINE:
            raise YimiError(
                "enrollment_inconsistent",
                f"segment {i} does not sound like the others (cosine {cos:.2f} < {LEAVE_ONE_OUT_MIN_COSINE}); "
                "nothing was enrolled — record the set again",
                segment=i,
                cosine=round(cos, 3),
            )
    return weighted_centroid(vectors, weights)


def enroll_channel(owner_id: int, channel: str, model_key: str, segments: Sequence[EnrollmentSegment]) -> VoiceprintEnrollment:
    """Enroll (or re-enroll) one capture channel under one voiceprint model.

    Steps: 1. ``check_enrollment`` (nothing is written if a rule fails); 2. in one
    transaction, lock the channel's threshold row (created at the configured value, never
    below 0.65); 3. replace the channel's enrollment and its samples — learning samples
    judged against the old set go with it; the threshold stays (it never lowers).
    """
    if not CHANNEL_NAME.match(channel or ""):
        raise YimiError("invalid_channel", "a capture channel is named like phone_app, glasses, mac")
    if not model_key:
        raise YimiError("voiceprint_unavailable", "no voiceprint model is configured")
    centroid = check_enrollment(segments)
    with transaction.atomic():
        _lock_channel(owner_id, channel, model_key)
        VoiceprintEnrollment.objects.filter(owner_id=owner_id, channel=channel, model_key=model_key).delete()
        VoiceprintSample.objects.filter(owner_id=owner_id, channel=channel, model_key=model_key).delete()
        enrollment = VoiceprintEnrollment.objects.create(
            owner_id=owner_id, channel=channel, model_key=model_key, centroid=centroid.tolist(), dim=centroid.size,
            segment_count=len(segments), voiced_ms_total=sum(s.voiced_ms for s in segments),
        )
        VoiceprintSample.objects.bulk_create(
            VoiceprintSample(
                owner_id=owner_id, channel=channel, model_key=model_key, source=VoiceprintSample.Source.ENROLLED,
                embedding=unit(s.embedding).tolist(), voiced_ms=s.voiced_ms, quality=float(s.quality),
            )
            for s in segments
        )
    log_event("voiceprint_enrolled", channel=channel, model=model_key, segments=len(segments))
    return enrollment


def enrolled_channels(owner_id: int, model_key: str) -> list[str]:
    return list(
        VoiceprintEnrollment.objects.filter(owner_id=owner_id, model_key=model_key).order_by("channel").values_list("channel", flat=True)
    )


# --- thresholds -----------------------------------------------------------------------------------


def configured_threshold() -> float:
    return max(THRESHOLD_FLOOR, float(getattr(settings, "VOICEPRINT_THRESHOLD", THRESHOLD_FLOOR)))


def _lock_channel(owner_id: int, channel: str, model_key: str) -> ChannelThreshold:
    """The channel's threshold row, created if needed and locked (``SELECT … FOR UPDATE``)."""
    try:
        with transaction.atomic():
            ChannelThreshold.objects.get_or_create(
                owner_id=owner_id, channel=channel, model_key=model_key,
                defaults={"value": configured_threshold(), "reason": "configured"},
            )
    except IntegrityError:
        pass
    return ChannelThreshold.objects.select_for_update().get(owner_id=owner_id, channel=channel, model_key=model_key)


def threshold(owner_id: int, channel: str, model_key: str) -> float:
    """The channel's verification threshold: persistent, only rising, never below 0.65.

    Steps: 1. the stored value (a new channel starts at the configured value, floored at
    0.65); 2. a configured value above it raises it, by conditional UPDATE
    ``value < configured``; a lower configured value is ignored; 3. never below 0.65.
    """
    configured = configured_threshold()
    row = ChannelThreshold.objects.filter(owner_id=owner_id, channel=channel, model_key=model_key).first()
    if row is None:
        try:
            with transaction.atomic():
                row = ChannelThreshold.objects.create(
                    owner_id=owner_id, channel=channel, model_key=model_key, value=configured, reason="configured"
                )
        except IntegrityError:
            row = ChannelThreshold.objects.get(owner_id=owner_id, channel=channel, model_key=model_key)
    if configured > row.value:
        _raise(row.id, configured, "configured")
        row.refresh_from_db()
    return max(THRESHOLD_FLOOR, row.value)


def _raise(row_id: int, value: float, reason: str) -> bool:
    from django.utils import timezone

    return bool(
        ChannelThreshold.objects.filter(id=row_id, value__lt=value).update(value=value, reason=reason, raised_at=timezone.now())
    )


# --- scoring -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VoiceprintMatch:
    """``s = max over channels of cos(x, c_k)``; verified when some channel reaches its own
    threshold (all are 0.65 unless raised), uncertain from 0.45, unmatched below. An empty
    band means there was nothing to compare against (no enrollment)."""

    band: str
    score: float | None
    channel: str | None
    scores: dict[str, float] = field(default_factory=dict)

    @property
    def verified(self) -> bool:
        return self.band == VERIFIED


def match(owner_id: int, model_key: str, embedding: Sequence[float] | np.ndarray) -> VoiceprintMatch:
    x = unit(embedding)
    scores: dict[str, float] = {}
    verified_on: str | None = None
    for enrollment in VoiceprintEnrollment.objects.filter(owner_id=owner_id, model_key=model_key).order_by("channel"):
        if enrollment.dim != x.size:
            continue
        s = float(np.dot(x, unit(enrollment.centroid)))
        scores[enrollment.channel] = s
        if verified_on is None and s >= threshold(owner_id, enrollment.channel, model_key):
            verified_on = enrollment.channel
    if not scores:
        return VoiceprintMatch(band="", score=None, channel=None)
    best = max(scores, key=lambda ch: scores[ch])
    s = scores[best]
    if verified_on is not None:
        return VoiceprintMatch(VERIFIED, s, verified_on, scores)
    return VoiceprintMatch(UNCERTAIN if s >= UNCERTAIN_FROM else UNMATCHED, s, best, scores)


# --- learning inside a trust window ----------------------------------------------------------------


@dataclass(frozen=True)
class LearningOutcome:
    learned: bool
    reason: str  # anchor, learned, too_short, low_quality, learning_full, not_enrolled, inconsistent_with_enrollment, inconsistent_with_anchor, inconsistent_with_set
    threshold_raised_to: float | None = None


def add_learning_sample(
    owner_id: int, channel: str, model_key: str, embedding: Sequence[float] | np.ndarray, *, voiced_ms: int, quality: float
) -> LearningOutcome:
    """Keep speech confirmed by a trust window as a learning sample of its channel.

    The caller has checked that the speech is inside an open trust window, in normal mode
    and not Yimi's own echo. Steps: 1. at least 1,000 ms voiced and quality ≥ 0.5;
    2. lock the channel (its threshold row), so concurrent samples queue; 3. stop at 20
    learning samples on the channel (no rolling replacement); 4. the channel must be
    enrolled, and the sample — the anchor too — must score at least the uncertain band
    (0.45) against the centroid of the enrolled segments alone, so a stranger speaking in
    the owner's trust window never becomes the anchor or a sample; 5. the first sample is
    the anchor; every later one needs cosine ≥ 0.65 with the anchor and with the centroid
    of the existing learning set; 6. store it, fold it into the channel's centroid and
    apply the automatic raising rule.
    """
    if voiced_ms < LEARNING_MIN_VOICED_MS:
        return LearningOutcome(False, "too_short")
    if quality < LEARNING_MIN_QUALITY:
        return LearningOutcome(False, "low_quality")
    x = unit(embedding)
    with transaction.atomic():
        lock = _lock_channel(owner_id, channel, model_key)
        learned = list(
            VoiceprintSample.objects.filter(
                owner_id=owner_id, channel=channel, model_key=model_key, source=VoiceprintSample.Source.LEARNED
            ).order_by("created_at", "id")
        )
        if len(learned) >= LEARNING_CAP:
            return LearningOutcome(False, "learning_full")
        enrolled = _enrolled_centroid(owner_id, channel, model_key)
        if enrolled is None or enrolled.size != x.size:
            return LearningOutcome(False, "not_enrolled")
        if float(np.dot(x, enrolled)) < LEARNING_MIN_ENROLLED_SCORE:
            return LearningOutcome(False, "inconsistent_with_enrollment")
        is_anchor = not learned
        if not is_anchor:
            anchor = next((s for s in learned if s.is_anchor), learned[0])
            if float(np.dot(x, unit(anchor.embedding))) < LEARNING_MIN_COSINE:
                return LearningOutcome(False, "inconsistent_with_anchor")
            set_centroid = weighted_centroid([unit(s.embedding) for s in learned], [s.voiced_ms * s.quality for s in learned])
            if float(np.dot(x, set_centroid)) < LEARNING_MIN_COSINE:
                return LearningOutcome(False, "inconsistent_with_set")
        VoiceprintSample.objects.create(
            owner_id=owner_id, channel=channel, model_key=model_key, source=VoiceprintSample.Source.LEARNED,
            embedding=x.tolist(), voiced_ms=voiced_ms, quality=float(quality), is_anchor=is_anchor,
        )
        _refresh_centroid(owner_id, channel, model_key)
        raised = _apply_raising_rule(lock, owner_id, channel, model_key)
    log_event("voiceprint_learned", channel=channel, model=model_key, anchor=is_anchor, samples=len(learned) + 1)
    return LearningOutcome(True, "anchor" if is_anchor else "learned", raised)


def _enrolled_centroid(owner_id: int, channel: str, model_key: str) -> np.ndarray | None:
    """The centroid of the channel's enrolled segments alone (learned samples excluded), or
    None when the channel is not enrolled under this model."""
    enrolled = list(
        VoiceprintSample.objects.filter(
            owner_id=owner_id, channel=channel, model_key=model_key, source=VoiceprintSample.Source.ENROLLED
        )
    )
    if not enrolled:
        return None
    return weighted_centroid([unit(s.embedding) for s in enrolled], [s.voiced_ms * s.quality for s in enrolled])


def _refresh_centroid(owner_id: int, channel: str, model_key: str) -> None:
    enrollment = VoiceprintEnrollment.objects.filter(owner_id=owner_id, channel=channel, model_key=model_key).first()
    if enrollment is None:
        return
    samples = list(VoiceprintSample.objects.filter(owner_id=owner_id, channel=channel, model_key=model_key))
    centroid = weighted_centroid([unit(s.embedding) for s in samples], [s.voiced_ms * s.quality for s in samples])
    VoiceprintEnrollment.objects.filter(id=enrollment.id).update(centroid=centroid.tolist())


def _apply_raising_rule(lock: ChannelThreshold, owner_id: int, channel: str, model_key: str) -> float | None:
    """The automatic raising rule (docs/voice.md).

    Confirmed samples are the channel's learning samples: each was confirmed as the owner
    by a biometric trust window, independently of the voiceprint. With at least 10 of
    them, each is scored against the centroid of the enrolled segments alone (so no
    sample judges itself), and the threshold may rise to
    ``min(lowest score − 0.05, current + 0.05, 0.85)``: high enough to make the channel
    stricter, low enough that every confirmed sample would still be verified. It only
    ever rises (conditional UPDATE ``value < new``).
    """
    samples = list(VoiceprintSample.objects.filter(owner_id=owner_id, channel=channel, model_key=model_key))
    enrolled = [s for s in samples if s.source == VoiceprintSample.Source.ENROLLED]
    confirmed = [s for s in samples if s.source == VoiceprintSample.Source.LEARNED]
    if len(confirmed) < RAISE_MIN_CONFIRMED or not enrolled:
        return None
    base = weighted_centroid([unit(s.embedding) for s in enrolled], [s.voiced_ms * s.quality for s in enrolled])
    lowest = min(float(np.dot(unit(s.embedding), base)) for s in confirmed)
    candidate = round(min(lowest - RAISE_MARGIN, lock.value + RAISE_MAX_STEP, RAISE_CEILING), 4)
    if candidate > lock.value and _raise(lock.id, candidate, "confirmed_samples"):
        log_event("voiceprint_threshold_raised", channel=channel, model=model_key, value=candidate, confirmed=len(confirmed))
        return candidate
    return None
