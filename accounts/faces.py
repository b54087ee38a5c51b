"""Faces the owner enrolled: enrollment per person, scoring, persistent thresholds.

The only code that writes ``FaceEnrollment``, ``FaceSample`` and ``FaceThreshold``. Like
``accounts.voiceprint``, nothing here touches pixels: embeddings arrive as vectors computed
by a face model named by its catalog key (``model_key``); detecting and embedding faces in a
photo is ``voice.faces``. Rules and numbers are in docs/faces.md.

Honesty rules: a face is named only when it reaches the person's own threshold, clearly
above every other enrolled person, and only once per image; everything else is unknown and
is never guessed. Only names the owner enrolled can ever come out of here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import FaceEnrollment, FaceSample, FaceThreshold
from accounts.voiceprint import unit
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

# Cosine similarity between a face's embedding and a person's centroid (docs/faces.md).
# SFace's published verification threshold is 0.363 (cosine, LFW): at that score two faces
# are as likely the same person as not. Naming someone needs more than that, so the floor
# of a person's threshold is 0.5; scores from 0.363 up to the threshold are "uncertain",
# below it "unmatched" — both are unknown faces, never named.
THRESHOLD_FLOOR = 0.5
UNCERTAIN_FROM = 0.363
THRESHOLD_CEILING = 0.95  # the owner may raise a threshold up to here
AMBIGUITY_MARGIN = 0.05  # the best person must beat every other person passing their threshold by this
PHOTOS_MIN, PHOTOS_MAX = 1, 20
ENROLL_MIN_FACE_PX = 80  # an enrollment photo's face is at least 80 × 80 pixels
LEAVE_ONE_OUT_MIN_COSINE = THRESHOLD_FLOOR  # each photo against the others' centroid
NAME_MAX = 64

RECOGNIZED, UNCERTAIN, UNMATCHED, AMBIGUOUS = "recognized", "uncertain", "unmatched", "ambiguous"


# --- enrollment ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnrollmentPhoto:
    """One enrollment photo's single face, as ``voice.faces`` found and embedded it."""

    embedding: Sequence[float] | np.ndarray
    face_px: int
    photo_sha256: str


def clean_name(name: str) -> str:
    name = " ".join((name or "").split())
    if not name or len(name) > NAME_MAX or not name.isprintable():
        raise YimiError("invalid_request", f"a person's name is 1 to {NAME_MAX} printable characters")
    return name


def mean_centroid(vectors: Sequence[np.ndarray]) -> np.ndarray:
    return unit(np.sum([unit(v) for v in vectors], axis=0))


def check_enrollment(photos: Sequence[EnrollmentPhoto]) -> np.ndarray:
    """Apply the enrollment rules to one person's photos; returns the centroid.

    Steps: 1. 1 to 20 photos, no photo twice; 2. each face at least 80 pixels on a side;
    3. embeddings of one size; 4. with two or more photos, leave-one-out: each photo against
    the centroid of the others — any cosine below 0.5 rejects the whole set (a photo of
    someone else, or a bad photo, must not become part of the person); 5. the centroid (mean
    of the unit embeddings).
    """
    if len(photos) < PHOTOS_MIN:
        raise YimiError("enrollment_too_few", "enroll a person from at least one photo")
    if len(photos) > PHOTOS_MAX:
        raise YimiError("enrollment_too_many", f"a person takes at most {PHOTOS_MAX} photos (got {len(photos)})")
    if len({p.photo_sha256 for p in photos}) != len(photos):
        raise YimiError("enrollment_invalid", "the same photo was given twice")
    for i, photo in enumerate(photos):
        if photo.face_px < ENROLL_MIN_FACE_PX:
            raise YimiError(
                "enrollment_face_too_small",
                f"photo {i + 1}: the face is {photo.face_px} pixels wide; enrollment needs at least {ENROLL_MIN_FACE_PX}",
                photo=i + 1,
            )
    vectors = [unit(p.embedding) for p in photos]
    if len({v.size for v in vectors}) != 1:
        raise YimiError("enrollment_invalid", "all photos must be embedded by the same face model")
    if len(vectors) >= 2:
        for i, v in enumerate(vectors):
            cos = float(np.dot(v, mean_centroid(vectors[:i] + vectors[i + 1 :])))
            if cos < LEAVE_ONE_OUT_MIN_COSINE:
                raise YimiError(
                    "enrollment_inconsistent",
                    f"photo {i + 1} does not look like the others (cosine {cos:.2f} < {LEAVE_ONE_OUT_MIN_COSINE}); nothing was enrolled",
                    photo=i + 1,
                    cosine=round(cos, 3),
                )
    return mean_centroid(vectors)


def enroll_person(owner_id: int, name: str, model_key: str, photos: Sequence[EnrollmentPhoto]) -> FaceEnrollment:
    """Enroll (or re-enroll) one person under one face model.

    Steps: 1. ``check_enrollment`` (nothing is written if a rule fails); 2. in one
    transaction, lock the person's threshold row (created at the configured value, never
    below the floor); 3. replace the person's enrollment under this model and its samples.
    The threshold stays: re-enrolling never lowers it.
    """
    name = clean_name(name)
    if not model_key:
        raise YimiError("face_model_unavailable", "no face model is in the local catalog")
    centroid = check_enrollment(photos)
    with transaction.atomic():
        _lock_threshold(owner_id, name, model_key)
        FaceEnrollment.objects.filter(owner_id=owner_id, name=name, model_key=model_key).delete()
        enrollment = FaceEnrollment.objects.create(
            owner_id=owner_id, name=name, model_key=model_key, centroid=centroid.tolist(), dim=centroid.size, photo_count=len(photos)
        )
        FaceSample.objects.bulk_create(
            FaceSample(enrollment=enrollment, embedding=unit(p.embedding).tolist(), face_px=p.face_px, photo_sha256=p.photo_sha256)
            for p in photos
        )
    log_event("face_enrolled", model=model_key, photos=len(photos))
    return enrollment


def forget_person(owner_id: int, enrollment_id: int) -> None:
    """Delete one enrollment and its samples. Its threshold row stays (it never lowers)."""
    FaceEnrollment.objects.filter(owner_id=owner_id, id=enrollment_id).delete()


def reenrollment_needed(owner_id: int, model_key: str) -> list[str]:
    """People enrolled under some other face model but not under ``model_key``: their
    embeddings cannot be compared with this model's, so they are not recognized until the
    owner enrolls them again."""
    current = set(FaceEnrollment.objects.filter(owner_id=owner_id, model_key=model_key).values_list("name", flat=True))
    others = FaceEnrollment.objects.filter(owner_id=owner_id).exclude(model_key=model_key).values_list("name", flat=True)
    return sorted(set(others) - current)


# --- thresholds -----------------------------------------------------------------------------------


def configured_threshold() -> float:
    return min(THRESHOLD_CEILING, max(THRESHOLD_FLOOR, float(getattr(settings, "FACE_THRESHOLD", THRESHOLD_FLOOR))))


def _lock_threshold(owner_id: int, name: str, model_key: str) -> FaceThreshold:
    try:
        with transaction.atomic():
            FaceThreshold.objects.get_or_create(
                owner_id=owner_id, name=name, model_key=model_key, defaults={"value": configured_threshold(), "reason": "configured"}
            )
    except IntegrityError:
        pass
    return FaceThreshold.objects.select_for_update().get(owner_id=owner_id, name=name, model_key=model_key)


def threshold(owner_id: int, name: str, model_key: str) -> float:
    """The person's recognition threshold: persistent, only rising, never below 0.5.

    Steps: 1. the stored value (a new person starts at the configured value, floored at
    0.5); 2. a configured value above it raises it by conditional UPDATE ``value <
    configured``; a lower configured value is ignored; 3. never below the floor.
    """
    configured = configured_threshold()
    row = FaceThreshold.objects.filter(owner_id=owner_id, name=name, model_key=model_key).first()
    if row is None:
        try:
            with transaction.atomic():
                row = FaceThreshold.objects.create(owner_id=owner_id, name=name, model_key=model_key, value=configured)
        except IntegrityError:
            row = FaceThreshold.objects.get(owner_id=owner_id, name=name, model_key=model_key)
    if configured > row.value:
        _raise(row.id, configured, "configured")
        row.refresh_from_db()
    return max(THRESHOLD_FLOOR, row.value)


def raise_threshold(owner_id: int, name: str, model_key: str, value: float) -> float:
    """The owner raises one person's threshold (the console). A value at or below the
    current one is refused with ``threshold_only_rises`` and changes nothing; above 0.95 is
    refused too (nobody would ever be recognized)."""
    current = threshold(owner_id, name, model_key)
    if not (value <= THRESHOLD_CEILING):
        raise YimiError("invalid_request", f"a face threshold is at most {THRESHOLD_CEILING}")
    if value <= current:
        raise YimiError("threshold_only_rises", f"the threshold is {current:.3f}; it can only be raised")
    row = FaceThreshold.objects.get(owner_id=owner_id, name=name, model_key=model_key)
    if not _raise(row.id, round(float(value), 4), "owner"):
        raise YimiError("threshold_only_rises", "the threshold was raised meanwhile; it can only be raised")
    log_event("face_threshold_raised", model=model_key, value=round(float(value), 4))
    return round(float(value), 4)


def _raise(row_id: int, value: float, reason: str) -> bool:
    return bool(FaceThreshold.objects.filter(id=row_id, value__lt=value).update(value=value, reason=reason, raised_at=timezone.now()))


# --- scoring -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaceMatch:
    """One face against everyone enrolled under the model. ``name`` is set only when the band
    is ``recognized``; ``best`` is the closest person, for the owner's console only."""

    band: str  # recognized | ambiguous | uncertain | unmatched | "" (nobody enrolled under this model)
    name: str | None
    score: float | None
    best: str | None = None
    scores: dict[str, float] = field(default_factory=dict)


def match_faces(owner_id: int, model_key: str, embeddings: Sequence[Sequence[float] | np.ndarray]) -> list[FaceMatch]:
    """Score each face of one image against every person enrolled under ``model_key``.

    Steps: 1. ``s = cos(x, c_person)`` for each person with an enrollment of the same size;
    2. a person passes when ``s`` reaches their own threshold (0.5 unless raised); 3. a face
    is ``recognized`` as the best passing person only if that person beats every other
    passing person by 0.05, else ``ambiguous``; 4. no passing person: ``uncertain`` from
    0.363, ``unmatched`` below; 5. a name recognized on two faces of one image is given to
    neither (both ``ambiguous``): the same person is not in a picture twice.
    """
    people = list(FaceEnrollment.objects.filter(owner_id=owner_id, model_key=model_key))
    thresholds = {p.name: threshold(owner_id, p.name, model_key) for p in people}
    results: list[FaceMatch] = []
    for embedding in embeddings:
        x = unit(embedding)
        scores = {p.name: float(np.dot(x, unit(p.centroid))) for p in people if p.dim == x.size}
        if not scores:
            results.append(FaceMatch("", None, None))
            continue
        best = max(scores, key=lambda n: scores[n])
        passing = sorted((n for n in scores if scores[n] >= thresholds[n]), key=lambda n: -scores[n])
        if passing and all(scores[passing[0]] - scores[n] >= AMBIGUITY_MARGIN for n in passing[1:]):
            results.append(FaceMatch(RECOGNIZED, passing[0], scores[passing[0]], best, scores))
        elif passing:
            results.append(FaceMatch(AMBIGUOUS, None, scores[best], best, scores))
        else:
            band = UNCERTAIN if scores[best] >= UNCERTAIN_FROM else UNMATCHED
            results.append(FaceMatch(band, None, scores[best], best, scores))
    named = [m.name for m in results if m.name]
    twice = {n for n in named if named.count(n) > 1}
    return [FaceMatch(AMBIGUOUS, None, m.score, m.best, m.scores) if m.name in twice else m for m in results]
