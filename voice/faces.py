"""Faces in a picture: detection (OpenCV Haar cascade), embedding (a face model from the
local catalog, run with onnxruntime), and the owner's enrolled people (``accounts.faces``).

The way of one image: decode (JPEG or PNG, size checked from the header before decoding) →
downscale to at most 1920 pixels on the long side → detect frontal faces at least 40 pixels
wide → for each face, a square crop around the detected box (a 10 % margin, edges
replicated) resized to the model's input → embed → compare with the people the owner
enrolled under the same model (``accounts.faces.match_faces``).

``recognized_people(image)`` is what the brain may be told: the names of enrolled people
recognized in the image, and nothing else. Unknown faces are never guessed. Photos are not
kept here: enrollment keeps each photo's embedding and SHA-256 only, recognition keeps
nothing. Docs: docs/faces.md.

Faces are not aligned by landmarks (no packaged detector gives landmarks; Haar gives a box),
so a model trained on aligned crops (SFace, ArcFace) scores lower than its published
numbers; the thresholds are set for that (docs/faces.md).
"""

from __future__ import annotations

import hashlib
import io
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from accounts import faces as enrolled
from accounts.models import FaceEnrollment
from accounts.services import get_owner
from llm import catalog
from llm.catalog import CatalogEntry
from yimi_project.errors import YimiError

IMAGE_MAX_BYTES = 20 * 1024 * 1024
IMAGE_MAX_PIXELS = 50_000_000  # a 48-megapixel phone photo fits; decompression bombs do not
DETECT_MAX_SIDE = 1920  # larger images are scaled down before detection
DETECT_MIN_FACE_PX = 40
DETECT_SCALE_FACTOR = 1.1
DETECT_MIN_NEIGHBORS = 5
CROP_MARGIN = 0.1
CASCADE = "haarcascade_frontalface_default.xml"

Image = bytes | str | Path | np.ndarray  # encoded bytes, a file path, or decoded BGR pixels


# --- decoding and detection --------------------------------------------------------------------


def decode_image(image: Image) -> np.ndarray:
    """BGR pixels (uint8, H × W × 3) of a JPEG or PNG; ``invalid_image`` when it is not one,
    ``image_too_large`` over 20 MB or 50 megapixels (read from the header, before decoding)."""
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise YimiError("invalid_image", "pixels are an H × W × 3 uint8 BGR array")
        return image
    data = Path(image).read_bytes() if isinstance(image, str | Path) else image
    if len(data) > IMAGE_MAX_BYTES:
        raise YimiError("image_too_large", f"an image is at most {IMAGE_MAX_BYTES // (1024 * 1024)} MB")
    if not (data.startswith(b"\xff\xd8\xff") or data.startswith(b"\x89PNG\r\n\x1a\n")):
        raise YimiError("invalid_image", "an image is a JPEG or a PNG")
    from PIL import Image as PILImage  # the header only: Pillow reads the size without decoding

    try:
        with PILImage.open(io.BytesIO(data)) as header:
            width, height = header.size
    except PILImage.DecompressionBombError:
        raise YimiError("image_too_large", f"an image has at most {IMAGE_MAX_PIXELS:,} pixels") from None
    except Exception:  # noqa: BLE001 - any parse failure means "not an image we can use"
        raise YimiError("invalid_image", "the image cannot be read") from None
    if width * height > IMAGE_MAX_PIXELS:
        raise YimiError("image_too_large", f"an image has at most {IMAGE_MAX_PIXELS:,} pixels")
    pixels = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    if pixels is None:
        raise YimiError("invalid_image", "the image cannot be decoded")
    return pixels


_cascade_lock = threading.Lock()
_cascades: dict[int, Any] = {}


def _cascade() -> Any:
    # A CascadeClassifier is not safe to share between threads: one per thread.
    key = threading.get_ident()
    with _cascade_lock:
        if key not in _cascades:
            classifier = cv2.CascadeClassifier(cv2.data.haarcascades + CASCADE)  # type: ignore[attr-defined]
            if classifier.empty():
                raise YimiError("face_model_unavailable", "OpenCV's frontal face cascade is missing (opencv-python-headless 4.x ships it)")
            _cascades[key] = classifier
        return _cascades[key]


def prepared(pixels: np.ndarray) -> np.ndarray:
    """The image as detection and embedding see it: at most 1920 pixels on the long side."""
    side = max(pixels.shape[:2])
    if side <= DETECT_MAX_SIDE:
        return pixels
    scale = DETECT_MAX_SIDE / side
    return cv2.resize(pixels, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)


def detect_faces(pixels: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Frontal faces as ``(x, y, w, h)`` boxes in ``pixels``, left to right."""
    gray = cv2.cvtColor(pixels, cv2.COLOR_BGR2GRAY)
    boxes = _cascade().detectMultiScale(
        gray, scaleFactor=DETECT_SCALE_FACTOR, minNeighbors=DETECT_MIN_NEIGHBORS, minSize=(DETECT_MIN_FACE_PX, DETECT_MIN_FACE_PX)
    )
    return sorted((tuple(int(v) for v in box) for box in boxes), key=lambda b: (b[0], b[1]))  # type: ignore[misc]


def face_crop(pixels: np.ndarray, box: tuple[int, int, int, int], size: tuple[int, int]) -> np.ndarray:
    """A square crop centred on the box, 10 % wider, edges replicated, resized to ``size``
    (width, height)."""
    x, y, w, h = box
    side = max(w, h) * (1 + CROP_MARGIN)
    x0, y0 = int(round(x + w / 2 - side / 2)), int(round(y + h / 2 - side / 2))
    x1, y1 = x0 + int(round(side)), y0 + int(round(side))
    top, left = max(0, -y0), max(0, -x0)
    bottom, right = max(0, y1 - pixels.shape[0]), max(0, x1 - pixels.shape[1])
    padded = cv2.copyMakeBorder(pixels, top, bottom, left, right, cv2.BORDER_REPLICATE) if top or left or bottom or right else pixels
    crop = padded[y0 + top : y1 + top, x0 + left : x1 + left]
    return cv2.resize(crop, size, interpolation=cv2.INTER_AREA if crop.shape[0] > size[1] else cv2.INTER_LINEAR)


# --- the face model ------------------------------------------------------------------------------


class FaceModel:
    """A face embedding model from the catalog: ONNX, one input ``[N, 3, H, W]`` and one
    output ``[N, D]``. Catalog metadata (all optional): ``channels`` (``rgb``, the default,
    or ``bgr``), ``mean`` and ``std`` (pixel values 0-255 become ``(v - mean) / std``;
    defaults 0 and 1, as SFace takes them; ArcFace-style models use 127.5 and 127.5)."""

    def __init__(self, entry: CatalogEntry, *, threads: int = 1) -> None:
        import onnxruntime as ort

        catalog.check_entry(entry)  # every file's SHA-256 before anything loads it
        self.entry = entry
        self.key = entry.key
        path = entry.path("model")
        self.size, self.dim = _validate_face_model(path, entry)
        meta = entry.metadata
        self.bgr = meta.get("channels", "rgb") == "bgr"
        try:
            self.mean, self.std = float(meta.get("mean", 0.0)), float(meta.get("std", 1.0))
        except (TypeError, ValueError):
            raise YimiError("model_metadata_invalid", f"face {entry.key}: mean and std are numbers") from None
        if self.std <= 0:
            raise YimiError("model_metadata_invalid", f"face {entry.key}: std must be positive")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def embed(self, crops: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One embedding per crop (BGR uint8 of the model's input size)."""
        if not crops:
            return []
        batch = np.stack([c if self.bgr else cv2.cvtColor(c, cv2.COLOR_BGR2RGB) for c in crops]).astype(np.float32)
        batch = ((batch - self.mean) / self.std).transpose(0, 3, 1, 2)
        out = np.asarray(self.session.run(None, {self.input_name: np.ascontiguousarray(batch)})[0], dtype=np.float64)
        if out.ndim != 2 or out.shape[0] != len(crops) or not np.all(np.isfinite(out)):
            raise YimiError("model_unreadable", f"face {self.key}: the model did not return one embedding per face")
        return list(out)


def _validate_face_model(path: str, entry: CatalogEntry) -> tuple[tuple[int, int], int]:
    """``(input width, height)`` and the embedding size, from the ONNX graph."""
    import onnx

    try:
        model = onnx.load(path, load_external_data=False)
    except Exception:  # noqa: BLE001
        raise YimiError("model_unreadable", f"face {entry.key}: not a readable ONNX model") from None
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]

    def dims(value_info: Any) -> list[int]:
        return [d.dim_value if d.HasField("dim_value") else 0 for d in value_info.type.tensor_type.shape.dim]

    if len(inputs) != 1 or len(model.graph.output) != 1:
        raise YimiError("model_metadata_invalid", f"face {entry.key}: one input (the face) and one output (the embedding)")
    shape, out = dims(inputs[0]), dims(model.graph.output[0])
    if len(shape) != 4 or shape[1] != 3 or not (16 <= shape[2] <= 512 and 16 <= shape[3] <= 512):
        raise YimiError("model_metadata_invalid", f"face {entry.key}: the input must be [N, 3, H, W] with a fixed H and W")
    if len(out) != 2 or not 1 <= out[1] <= 4096:
        raise YimiError("model_metadata_invalid", f"face {entry.key}: the output must be [N, D] with a fixed D")
    return (shape[3], shape[2]), out[1]


_models: dict[tuple[str, str], FaceModel] = {}
_models_lock = threading.Lock()


def current_face_entry() -> CatalogEntry:
    """The face model in use: the catalog's face model marked ``default`` (or its only one).
    Changing it is a switch that goes through enrollment: people enrolled under the old model
    are not recognized until the owner enrolls them again."""
    entry = catalog.load_catalog().default_for("face")
    if entry is None:
        raise YimiError("face_model_unavailable", "no face model is in the local catalog (or none is marked default)")
    return entry


def face_model(entry: CatalogEntry | None = None) -> FaceModel:
    """The loaded model for ``entry`` (default: the model in use), one per process; its
    files' digests are checked again whenever they changed on disk (``verify_files``)."""
    entry = entry or current_face_entry()
    key = (entry.key, entry.digest_summary)
    with _models_lock:
        model = _models.get(key)
    if model is not None:
        catalog.verify_files(entry)
        return model
    model = FaceModel(entry)
    with _models_lock:
        return _models.setdefault(key, model)


# --- recognition and enrollment -------------------------------------------------------------------


@dataclass(frozen=True)
class Recognized:
    """One face in an image. ``name`` is an enrolled person's name, or None: unknown."""

    box: tuple[int, int, int, int]  # in the image's own pixels
    name: str | None
    band: str  # recognized | ambiguous | uncertain | unmatched | "" (nobody enrolled under the model)
    score: float | None


@dataclass(frozen=True)
class FaceReport:
    faces: list[Recognized]
    model_key: str
    reenrollment_needed: list[str]  # enrolled under another face model only: not compared

    @property
    def people(self) -> list[str]:
        return sorted({f.name for f in self.faces if f.name})


def _owner_id(owner: Any) -> int:
    if owner is None:
        owner = get_owner()
        if owner is None:
            raise YimiError("no_owner", "this instance has no owner yet")
    return int(owner if isinstance(owner, int) else owner.pk)


def recognize(image: Image, owner: Any = None) -> FaceReport:
    """Every face in ``image`` and who it is, if it is someone the owner enrolled under the
    face model in use. ``owner``: a user, a user id, or None for the instance's owner."""
    owner_id = _owner_id(owner)
    model = face_model()  # no face model: nothing to do, not even decoding
    pixels = decode_image(image)
    small = prepared(pixels)
    scale = pixels.shape[1] / small.shape[1]
    boxes = detect_faces(small)
    embeddings = model.embed([face_crop(small, box, model.size) for box in boxes])
    matches = enrolled.match_faces(owner_id, model.key, embeddings)
    faces = [
        Recognized(tuple(int(round(v * scale)) for v in box), m.name, m.band, None if m.score is None else round(m.score, 4))  # type: ignore[arg-type]
        for box, m in zip(boxes, matches, strict=True)
    ]
    return FaceReport(faces, model.key, enrolled.reenrollment_needed(owner_id, model.key))


def recognized_people(image: Image, owner: Any = None) -> list[str]:
    """The enrolled people recognized in ``image``, by name: facts the brain may be told
    ("前面是王阿姨" only when the owner enrolled 王阿姨). Unknown faces give no name."""
    return recognize(image, owner).people


def enroll_from_photos(owner: Any, name: str, photos: Sequence[bytes]) -> FaceEnrollment:
    """Enroll one person from the owner's photos under the face model in use.

    Steps: 1. each photo decodes (JPEG or PNG) and holds exactly one face — none or several
    is ``enrollment_face_count`` naming the photo, and nothing is enrolled; 2. the faces are
    embedded; 3. ``accounts.faces.enroll_person`` applies the enrollment rules (face size,
    consistency) and stores the embeddings. The photos themselves are not kept.
    """
    owner_id = _owner_id(owner)
    if len(photos) > enrolled.PHOTOS_MAX:
        raise YimiError("enrollment_too_many", f"a person takes at most {enrolled.PHOTOS_MAX} photos (got {len(photos)})")
    model = face_model()
    found: list[tuple[np.ndarray, tuple[int, int, int, int], float, str]] = []
    for i, data in enumerate(photos):
        pixels = decode_image(data)
        small = prepared(pixels)
        boxes = detect_faces(small)
        if len(boxes) != 1:
            raise YimiError(
                "enrollment_face_count",
                f"photo {i + 1} shows {len(boxes)} faces; an enrollment photo shows exactly one face",
                photo=i + 1,
                faces=len(boxes),
            )
        found.append((small, boxes[0], pixels.shape[1] / small.shape[1], hashlib.sha256(data).hexdigest()))
    embeddings = model.embed([face_crop(small, box, model.size) for small, box, _, _ in found])
    return enrolled.enroll_person(
        owner_id,
        name,
        model.key,
        [
            enrolled.EnrollmentPhoto(embedding=e, face_px=int(round(max(box[2:]) * scale)), photo_sha256=digest)
            for e, (_, box, scale, digest) in zip(embeddings, found, strict=True)
        ],
    )


def image_analyzer(image: Any) -> list[dict[str, Any]]:
    """The analyzer for attached images (``memory.personal.images.register_image_analyzer``; ``image``
    is its ``StoredImage``): the enrolled people recognized, each ``{name, score, box,
    model}``. Only images admitted as the owner's are looked at: a guest's photo never
    learns who the owner enrolled. No face model in the catalog: nobody is recognized."""
    if getattr(image, "scope", "") != "owner":
        return []
    try:
        report = recognize(image.read(), image.owner_id)
    except YimiError as exc:
        if exc.code == "face_model_unavailable":
            return []
        raise
    return [{"name": f.name, "score": f.score, "box": list(f.box), "model": report.model_key} for f in report.faces if f.name]
