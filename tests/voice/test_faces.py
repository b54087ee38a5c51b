"""Faces the owner enrolled (docs/faces.md): OpenCV's Haar cascade finds real faces in real
photos, a face model from the local catalog (a small real ONNX model built here, listed with
its SHA-256) embeds them, and only people the owner enrolled are ever named.

What these tests prove and what they do not: the detector is the real one and the faces are
real (Eileen Collins and Grace Hopper, tests/support/data/faces/README.md). The "other photos" of a
person are made from one photograph (rescaled, moved onto a 1280 × 720 frame, re-encoded as
JPEG), and the test model compares coarse light and colour layouts, not identities. So they
prove the service's way and its honesty rules — detect, crop, embed, compare, thresholds,
re-enrollment — not how well a real face model tells people apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from accounts import faces as enrolled
from accounts.models import FaceEnrollment, FaceSample, FaceThreshold
from tests.support.face_support import (
    COLLINS,
    HOPPER,
    build_face_model,
    drawn_scene,
    face_entry,
    jpeg,
    load,
    on_frame,
    png,
    tilted,
    write_catalog,
)
from voice import faces
from yimi_project.errors import YimiError

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def face_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("face-models")
    return {"v1": build_face_model(directory / "face-v1.onnx", seed=7), "v2": build_face_model(directory / "face-v2.onnx", seed=11)}


@pytest.fixture
def face_catalog(face_models: dict[str, str], tmp_path: Path, settings: Any) -> Path:
    path = tmp_path / "catalog.json"
    settings.YIMI_LOCAL_CATALOG_FILE = write_catalog(path, [face_entry("test-face", "1", face_models["v1"])])
    return path


def collins_photos() -> list[bytes]:
    """Three enrollment photos of Eileen Collins: the original and two rescaled, shifted,
    JPEG-encoded versions of it."""
    original = load(COLLINS)
    return [
        COLLINS.read_bytes(),
        jpeg(on_frame(original, scale=0.9, at=(60, 40)), quality=90),
        jpeg(on_frame(original, scale=1.2, at=(500, 0)), quality=85),
    ]


def collins_elsewhere() -> bytes:
    """Another photo of her: head tilted by 12°, smaller, at the other side of a 1280 × 720
    frame, JPEG 80 (it scores about 0.75 against her enrollment with the test model)."""
    return jpeg(on_frame(tilted(load(COLLINS), -12), scale=0.8, at=(820, 180)), quality=80)


def hopper_photo() -> bytes:
    return jpeg(on_frame(load(HOPPER), scale=0.9, at=(600, 100)), quality=80)


def both_side_by_side() -> bytes:
    frame = on_frame(load(COLLINS), scale=1.0, at=(0, 100))
    hopper = cv2.resize(load(HOPPER), None, fx=0.9, fy=0.9, interpolation=cv2.INTER_AREA)
    frame[100 : 100 + min(hopper.shape[0], 620), 700 : 700 + hopper.shape[1]] = hopper[:620]
    return jpeg(frame, quality=85)


# --- detection ---------------------------------------------------------------------------------


def test_a_drawn_picture_has_no_face() -> None:
    pixels = faces.decode_image(png(drawn_scene()))
    assert faces.detect_faces(pixels) == []


def test_the_astronaut_s_face_is_detected() -> None:
    pixels = faces.decode_image(COLLINS.read_bytes())
    boxes = faces.detect_faces(pixels)
    assert len(boxes) == 1
    x, y, w, h = boxes[0]
    # Her face is in the upper middle of the 512 × 512 portrait, about 90 pixels wide.
    assert 150 <= x <= 210 and 40 <= y <= 100 and 80 <= w <= 120


def test_two_people_in_one_frame_are_two_faces() -> None:
    boxes = faces.detect_faces(faces.decode_image(both_side_by_side()))
    assert len(boxes) == 2
    assert boxes[0][0] < 600 < boxes[1][0]


def test_not_an_image_is_refused() -> None:
    with pytest.raises(YimiError) as refused:
        faces.decode_image(b"GIF89a not a photo")
    assert refused.value.code == "invalid_image"


def png_header_only(width: int, height: int) -> bytes:
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + chunk(b"IEND", b"")


def test_an_image_over_the_pixel_limit_is_refused_before_decoding() -> None:
    # PNG headers claiming 8,000 × 8,000 (over 50 megapixels) and 100,000 × 100,000 pixels,
    # with no pixel data at all: refused from the header alone.
    for side in (8000, 100_000):
        with pytest.raises(YimiError) as refused:
            faces.decode_image(png_header_only(side, side))
        assert refused.value.code == "image_too_large"


# --- enrollment ----------------------------------------------------------------------------------


def test_enrollment_from_photos_keeps_embeddings_not_photos(owner: Any, face_catalog: Path) -> None:
    enrollment = faces.enroll_from_photos(owner, "Eileen Collins", collins_photos())
    assert (enrollment.name, enrollment.model_key, enrollment.photo_count, enrollment.dim) == ("Eileen Collins", "test-face@1", 3, 128)
    samples = list(FaceSample.objects.filter(enrollment=enrollment))
    assert len(samples) == 3
    assert all(len(s.embedding) == 128 and len(s.photo_sha256) == 64 for s in samples)
    assert {s.face_px >= enrolled.ENROLL_MIN_FACE_PX for s in samples} == {True}
    assert FaceThreshold.objects.get(owner=owner, name="Eileen Collins").value == enrolled.THRESHOLD_FLOOR


def test_an_enrollment_photo_without_exactly_one_face_enrolls_nothing(owner: Any, face_catalog: Path) -> None:
    for bad, count in ((png(drawn_scene()), 0), (both_side_by_side(), 2)):
        with pytest.raises(YimiError) as refused:
            faces.enroll_from_photos(owner, "Eileen Collins", [COLLINS.read_bytes(), bad])
        assert refused.value.code == "enrollment_face_count"
        assert refused.value.details == {"photo": 2, "faces": count}
    assert not FaceEnrollment.objects.exists()


def test_a_photo_of_someone_else_in_the_set_rejects_the_whole_set(owner: Any, face_catalog: Path) -> None:
    with pytest.raises(YimiError) as refused:
        faces.enroll_from_photos(owner, "Eileen Collins", [*collins_photos(), hopper_photo()])
    assert refused.value.code == "enrollment_inconsistent"
    assert refused.value.details["photo"] == 4
    assert not FaceEnrollment.objects.exists()


def test_a_face_too_small_for_enrollment_is_refused(owner: Any, face_catalog: Path) -> None:
    small = jpeg(on_frame(load(COLLINS), scale=0.7, at=(820, 180)))  # her face is about 68 pixels wide
    assert faces.recognize(small, owner).faces[0].box[2] < enrolled.ENROLL_MIN_FACE_PX
    with pytest.raises(YimiError) as refused:
        faces.enroll_from_photos(owner, "Eileen Collins", [small])
    assert refused.value.code == "enrollment_face_too_small"
    assert not FaceEnrollment.objects.exists()


# --- recognition -------------------------------------------------------------------------------


def test_the_enrolled_person_is_recognized_in_another_photo(owner: Any, face_catalog: Path) -> None:
    faces.enroll_from_photos(owner, "Eileen Collins", collins_photos())
    report = faces.recognize(collins_elsewhere(), owner)
    assert len(report.faces) == 1
    face = report.faces[0]
    assert (face.name, face.band) == ("Eileen Collins", "recognized")
    assert face.score is not None and face.score >= enrolled.THRESHOLD_FLOOR
    assert face.box[0] >= 820  # in the frame's own pixels
    assert faces.recognized_people(collins_elsewhere(), owner) == ["Eileen Collins"]
    assert faces.recognized_people(collins_elsewhere()) == ["Eileen Collins"]  # the instance's owner by default


def test_an_unenrolled_face_is_unknown_never_guessed(owner: Any, face_catalog: Path) -> None:
    faces.enroll_from_photos(owner, "Eileen Collins", collins_photos())
    report = faces.recognize(hopper_photo(), owner)
    assert len(report.faces) == 1
    assert report.faces[0].name is None
    assert report.faces[0].band in ("uncertain", "unmatched")
    assert report.people == []
    # With both in one frame, only the enrolled one is named.
    both = faces.recognize(both_side_by_side(), owner)
    assert [f.name for f in both.faces] == ["Eileen Collins", None]
    assert faces.recognized_people(both_side_by_side(), owner) == ["Eileen Collins"]


def test_nobody_is_named_when_nobody_is_enrolled(owner: Any, face_catalog: Path) -> None:
    report = faces.recognize(collins_elsewhere(), owner)
    assert [(f.name, f.band) for f in report.faces] == [(None, "")]


def test_two_enrolled_people_too_close_to_tell_apart_are_not_named(owner: Any) -> None:
    base = np.zeros(16)
    base[0] = 1.0
    near = base.copy()
    near[1] = 0.1  # cosine ≈ 0.995 with base
    for name, vector in (("A", base), ("B", near)):
        enrolled.enroll_person(owner.id, name, "m@1", [enrolled.EnrollmentPhoto(vector, 100, name * 64)])
    (match,) = enrolled.match_faces(owner.id, "m@1", [base])
    assert (match.band, match.name) == ("ambiguous", None)
    # The same person on two faces of one image: neither face is named.
    far = np.zeros(16)
    far[2] = 1.0
    enrolled.enroll_person(owner.id, "C", "m@1", [enrolled.EnrollmentPhoto(far, 100, "c" * 64)])
    twice = enrolled.match_faces(owner.id, "m@1", [far, far])
    assert [(m.band, m.name) for m in twice] == [("ambiguous", None), ("ambiguous", None)]
    assert enrolled.match_faces(owner.id, "m@1", [far])[0].name == "C"


# --- thresholds ------------------------------------------------------------------------------------


def test_thresholds_only_rise(owner: Any, face_catalog: Path, settings: Any) -> None:
    faces.enroll_from_photos(owner, "Eileen Collins", collins_photos())
    score = faces.recognize(collins_elsewhere(), owner).faces[0].score
    assert score is not None
    # The owner raises it above this photo's score: the photo is no longer named.
    raised = round(min(score + 0.02, enrolled.THRESHOLD_CEILING), 3)
    assert enrolled.raise_threshold(owner.id, "Eileen Collins", "test-face@1", raised) == raised
    assert faces.recognized_people(collins_elsewhere(), owner) == []
    # Lowering is refused and changes nothing; nor does a lower configured value.
    with pytest.raises(YimiError) as refused:
        enrolled.raise_threshold(owner.id, "Eileen Collins", "test-face@1", enrolled.THRESHOLD_FLOOR)
    assert refused.value.code == "threshold_only_rises"
    settings.FACE_THRESHOLD = 0.3
    assert enrolled.threshold(owner.id, "Eileen Collins", "test-face@1") == raised
    # Re-enrolling and forgetting keep it.
    enrollment = faces.enroll_from_photos(owner, "Eileen Collins", collins_photos())
    enrolled.forget_person(owner.id, enrollment.id)
    assert enrolled.threshold(owner.id, "Eileen Collins", "test-face@1") == raised
    # A higher configured value raises it.
    settings.FACE_THRESHOLD = 0.9
    assert enrolled.threshold(owner.id, "Eileen Collins", "test-face@1") == 0.9


# --- the face model -------------------------------------------------------------------------------


def test_a_face_model_switch_needs_re_enrollment(owner: Any, face_models: dict[str, str], face_catalog: Path, settings: Any) -> None:
    faces.enroll_from_photos(owner, "Eileen Collins", collins_photos())
    # The deployer makes another face model the default: her embeddings cannot be compared.
    write_catalog(face_catalog, [face_entry("test-face", "1", face_models["v1"], default=False), face_entry("test-face", "2", face_models["v2"])])
    report = faces.recognize(collins_elsewhere(), owner)
    assert report.model_key == "test-face@2"
    assert [(f.name, f.band) for f in report.faces] == [(None, "")]
    assert report.reenrollment_needed == ["Eileen Collins"]
    # Enrolled again under the new model, she is recognized again.
    faces.enroll_from_photos(owner, "Eileen Collins", collins_photos())
    report = faces.recognize(collins_elsewhere(), owner)
    assert report.people == ["Eileen Collins"] and report.reenrollment_needed == []


def test_a_face_model_whose_file_changed_is_not_used(owner: Any, face_models: dict[str, str], tmp_path: Path, settings: Any) -> None:
    copy = tmp_path / "face.onnx"
    copy.write_bytes(Path(face_models["v1"]).read_bytes())
    settings.YIMI_LOCAL_CATALOG_FILE = write_catalog(tmp_path / "catalog.json", [face_entry("tampered", "1", copy)])
    copy.write_bytes(Path(face_models["v2"]).read_bytes())
    with pytest.raises(YimiError) as refused:
        faces.recognize(collins_elsewhere(), owner)
    assert refused.value.code == "model_digest_mismatch"


def test_no_face_model_in_the_catalog(owner: Any, settings: Any, tmp_path: Path) -> None:
    settings.YIMI_LOCAL_CATALOG_FILE = write_catalog(tmp_path / "catalog.json", [])
    with pytest.raises(YimiError) as refused:
        faces.recognized_people(collins_elsewhere(), owner)
    assert refused.value.code == "face_model_unavailable"


# --- the console page ------------------------------------------------------------------------------

PAGE = "/admin/accounts/faceenrollment/"


def test_the_owner_enrolls_from_photos_in_the_console(owner: Any, face_catalog: Path) -> None:
    client = Client()
    client.force_login(owner)
    page = client.get(PAGE)
    assert page.status_code == 200 and "test-face@1" in page.content.decode()
    uploads = [SimpleUploadedFile(f"p{i}.jpg", data, content_type="image/jpeg") for i, data in enumerate(collins_photos())]
    done = client.post(PAGE, {"action": "enroll", "name": "王阿姨", "photos": uploads})
    assert done.status_code == 302
    assert FaceEnrollment.objects.get(owner=owner).name == "王阿姨"
    assert faces.recognized_people(collins_elsewhere(), owner) == ["王阿姨"]
    assert "王阿姨" in client.get(PAGE).content.decode()
    # A photo with no face: a clear error, nothing changes.
    bad = client.post(PAGE, {"action": "enroll", "name": "Someone", "photos": [SimpleUploadedFile("x.png", png(drawn_scene()), "image/png")]})
    assert bad.status_code == 400 and "exactly one face" in bad.content.decode()
    assert FaceEnrollment.objects.count() == 1
    # Lowering the threshold from the page is refused.
    row = FaceEnrollment.objects.get(owner=owner)
    lower = client.post(PAGE, {"action": "raise", "enrollment": row.id, "threshold": "0.4"})
    assert lower.status_code == 400
    assert enrolled.threshold(owner.id, "王阿姨", "test-face@1") == enrolled.THRESHOLD_FLOOR
    client.post(PAGE, {"action": "forget", "enrollment": row.id})
    assert not FaceEnrollment.objects.exists()


def test_the_faces_page_is_403_for_staff_who_are_not_the_owner(owner: Any, face_catalog: Path, django_user_model: Any) -> None:
    faces.enroll_from_photos(owner, "Eileen Collins", collins_photos())
    staff = django_user_model.objects.create_superuser("reviewer", password="pw-pw-pw-pw")
    client = Client()
    client.force_login(staff)
    assert client.get(PAGE).status_code == 403
    photo = [SimpleUploadedFile("p.png", COLLINS.read_bytes(), "image/png")]
    assert client.post(PAGE, {"action": "enroll", "name": "Intruder", "photos": photo}).status_code == 403
    row = FaceEnrollment.objects.get()
    assert client.post(PAGE, {"action": "forget", "enrollment": row.id}).status_code == 403
    assert list(FaceEnrollment.objects.values_list("name", flat=True)) == ["Eileen Collins"]


# --- the image analyzer (the vision request's facts) ------------------------------------------------


class Attached:
    """Shaped like ``memory.personal.images.StoredImage``: what the image analyzer is given."""

    def __init__(self, data: bytes, owner_id: int, scope: str) -> None:
        self.data, self.owner_id, self.scope = data, owner_id, scope

    def read(self) -> bytes:
        return self.data


def test_the_image_analyzer_names_only_enrolled_people_and_only_for_the_owner(owner: Any, face_catalog: Path) -> None:
    faces.enroll_from_photos(owner, "王阿姨", collins_photos())
    found = faces.image_analyzer(Attached(both_side_by_side(), owner.id, "owner"))
    assert [p["name"] for p in found] == ["王阿姨"]
    assert found[0]["model"] == "test-face@1" and found[0]["score"] >= enrolled.THRESHOLD_FLOOR
    assert faces.image_analyzer(Attached(hopper_photo(), owner.id, "owner")) == []
    # A guest's photo never learns whom the owner enrolled.
    assert faces.image_analyzer(Attached(both_side_by_side(), owner.id, "guest")) == []


def test_an_owner_photo_attached_from_the_glasses_names_the_enrolled_person(owner: Any, face_catalog: Path, make_device: Any) -> None:
    """The whole way: the faces analyzer is registered (VoiceConfig.ready), the glasses'
    photo of Eileen Collins and Grace Hopper is stored and attached, and the vision turn's
    facts name only the enrolled person."""
    from brain.vision import people_fact
    from memory.personal import images as image_store

    faces.enroll_from_photos(owner, "王阿姨", collins_photos())
    glasses = make_device("glasses")
    uploaded = image_store.store_upload(device=glasses.device, scope="owner", data=both_side_by_side())
    attached = image_store.attach_image(device=glasses.device, scope="owner", image_id=uploaded.id, client_id="look", captured_at=None)
    attached.image.refresh_from_db()
    assert [p["name"] for p in attached.image.people] == ["王阿姨"]
    fact = people_fact(attached.image)
    assert "王阿姨" in fact and "Hopper" not in fact
