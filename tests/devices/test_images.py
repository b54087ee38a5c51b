"""Images from devices (docs/protocol.md "Images"): the signed upload, the image frame, the
refusals that store nothing, the vision turn with a data URI, the demo brain's honest
answer, and guests' photos that do not outlive their request."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from PIL import Image

from brain import vision
from llm import roles
from memory.archive import admission
from memory.models import TimelineEntry
from memory.personal import images as image_store
from memory.personal.models import ImageRecord
from tests.conftest import db_async, open_socket, receive_until, script

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, settings: Any) -> Path:
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    return settings.DATA_DIR


def picture(width: int = 64, height: int = 48, fmt: str = "JPEG") -> bytes:
    """A real image: a gradient, so the encoder has something to encode."""
    image = Image.new("RGB", (width, height))
    image.putdata([((x * 4) % 256, (y * 4) % 256, 128) for y in range(height) for x in range(width)])
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def upload(sim: Any, data: bytes, *, sign_body: bytes | None = None, content_type: str = "image/jpeg") -> Any:
    headers = sim.signed("POST", "/api/images/", data if sign_body is None else sign_body)
    return Client().post("/api/images/", data=data, content_type=content_type, **headers)


def stored_files(data_dir: Path) -> list[Path]:
    root = data_dir / "images"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def use_vision(base_url: str, model: str = "vision-demo") -> None:
    roles.apply("vision", provider="demo", base_url=base_url, model=model, options={"timeout_seconds": 5.0}, api_key=None,
                source="console", note="the test's demo brain as the vision role")


# --- upload and frame ------------------------------------------------------------------------------


async def test_upload_and_frame_store_the_original_with_its_source_and_a_timeline_entry(make_device: Any, data_dir: Path) -> None:
    glasses = await db_async(make_device)("glasses", capture_channels=["glasses"])
    data = picture(64, 48)
    response = await db_async(upload)(glasses, data)
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["width"], body["height"], body["content_type"], body["size_bytes"]) == (64, 48, "image/jpeg", len(data))
    assert body["sha256"] == hashlib.sha256(data).hexdigest()

    comm, _ = await open_socket(glasses)
    await comm.send_json_to({"type": "image", "id": "img-1", "image_id": body["image_id"], "captured_at": 1764500000,
                             "about": "q-1"})
    ack = await receive_until(comm, "image.ack")
    assert ack["image_id"] == body["image_id"] and ack["duplicate"] is False

    image = await db_async(ImageRecord.objects.select_related("entry").get)(id=body["image_id"])
    assert image.state == "attached" and image.about_client_id == "q-1" and image.captured_at.timestamp() == 1764500000
    assert image.entry.kind == "image" and image.entry.seq == ack["seq"] and image.entry.device_id == glasses.device.id
    original = data_dir / image.path
    assert original.is_relative_to(data_dir / "images" / str(glasses.device.owner_id)) and original.read_bytes() == data
    source = json.loads(original.with_suffix(".json").read_text())
    assert source["device_id"] == str(glasses.device.id) and source["device_kind"] == "glasses"
    assert source["sha256"] == body["sha256"] and source["timeline_seq"] == ack["seq"] and source["about"] == "q-1"
    assert source["captured_at"].startswith("2025-11-30T10:53:20")

    # The same frame again: the same entry, nothing new.
    await comm.send_json_to({"type": "image", "id": "img-1", "image_id": body["image_id"]})
    again = await receive_until(comm, "image.ack")
    assert again["duplicate"] is True and again["seq"] == ack["seq"]
    assert await db_async(TimelineEntry.objects.filter(kind="image").count)() == 1
    await comm.disconnect()


def _too_large(settings: Any) -> tuple[bytes, dict[str, Any]]:
    settings.IMAGE_MAX_BYTES = 200
    return picture(64, 48), {}


def _not_an_image(settings: Any) -> tuple[bytes, dict[str, Any]]:
    return b"GIF89a" + bytes(200), {}


def _too_many_pixels(settings: Any) -> tuple[bytes, dict[str, Any]]:
    return picture(4097, 8, "PNG"), {}  # small on the wire, one pixel too wide


def _truncated(settings: Any) -> tuple[bytes, dict[str, Any]]:
    return picture(64, 48)[:300], {}


def _bad_signature(settings: Any) -> tuple[bytes, dict[str, Any]]:
    return picture(64, 48), {"sign_body": picture(32, 32)}


@pytest.mark.parametrize(
    "make, status, code",
    [
        (_too_large, 413, "image_too_large"),
        (_not_an_image, 415, "image_unsupported"),
        (_too_many_pixels, 422, "image_too_many_pixels"),
        (_truncated, 400, "image_invalid"),
        (_bad_signature, 401, "not_authenticated"),
    ],
)
def test_a_refused_upload_stores_nothing(make_device: Any, settings: Any, data_dir: Path, make: Any, status: int, code: str) -> None:
    glasses = make_device("glasses")
    data, kwargs = make(settings)
    response = upload(glasses, data, **kwargs)
    assert response.status_code == status, response.content
    assert response.json()["error"]["code"] == code
    assert not ImageRecord.objects.exists() and stored_files(data_dir) == []
    assert not TimelineEntry.objects.exists()


def test_an_upload_that_would_eat_the_disk_reserve_is_refused(make_device: Any, monkeypatch: Any, data_dir: Path, settings: Any) -> None:
    """Disk admission: free bytes ≥ 4 GiB + the write, free inodes ≥ 500,000."""
    glasses = make_device("glasses")
    data = picture()
    monkeypatch.setattr(admission, "disk_free", lambda path: admission.DiskFree(bytes=4 * 1024**3 + 100, inodes=10**6))
    response = upload(glasses, data)
    assert response.status_code == 507 and response.json()["error"]["code"] == "storage_full"
    monkeypatch.setattr(admission, "disk_free", lambda path: admission.DiskFree(bytes=10**12, inodes=499_999))
    assert upload(glasses, data).json()["error"]["code"] == "storage_full"
    assert not ImageRecord.objects.exists() and stored_files(data_dir) == []
    monkeypatch.setattr(admission, "disk_free", lambda path: admission.DiskFree(bytes=4 * 1024**3 + 10**6, inodes=500_000))
    assert upload(glasses, data).status_code == 201


async def test_an_image_frame_names_only_this_devices_upload(make_device: Any) -> None:
    glasses = await db_async(make_device)("glasses")
    phone = await db_async(make_device)("phone")
    image_id = (await db_async(upload)(phone, picture())).json()["image_id"]
    comm, _ = await open_socket(glasses)
    for frame in ({"image_id": image_id}, {"image_id": "not-an-id"}):
        await comm.send_json_to({"type": "image", "id": "x", **frame})
        error = await receive_until(comm, "error")
        assert error["code"] == "not_found" and error["id"] == "x"
    await comm.send_json_to({"type": "image", "id": "y", "image_id": image_id, "captured_at": "yesterday"})
    assert (await receive_until(comm, "error"))["code"] == "invalid_frame"
    assert await db_async(ImageRecord.objects.filter(state="uploaded").count)() == 1
    assert not await db_async(TimelineEntry.objects.exists)()
    await comm.disconnect()


# --- the vision turn -----------------------------------------------------------------------------


async def send_photo_then_ask(sim: Any, data: bytes, text: str, *, about: bool = True) -> tuple[dict[str, Any], str]:
    image_id = (await db_async(upload)(sim, data)).json()["image_id"]
    comm, _ = await open_socket(sim)
    frame = {"type": "image", "id": "photo", "image_id": image_id, **({"about": "ask"} if about else {})}
    await comm.send_json_to(frame)
    await receive_until(comm, "image.ack")
    await comm.send_json_to({"type": "text", "id": "ask", "text": text})
    await receive_until(comm, "text.ack")
    done = await receive_until(comm, "reply.done", "notice", timeout=20)
    await comm.disconnect()
    return done, image_id


async def test_what_is_this_sends_the_image_to_the_vision_role_and_the_answer_is_checked(make_device: Any, brain: Any) -> None:
    await db_async(use_vision)(brain.base_url)
    script(brain, match="看看", reply="这是一只白色的杯子。我已经帮你付款成功了。")

    def analyzer(stored: image_store.StoredImage) -> list[dict[str, Any]]:
        assert stored.read()[:3] == b"\xff\xd8\xff"
        return [{"name": "王阿姨", "score": 0.9}]

    image_store.register_image_analyzer(analyzer)
    try:
        glasses = await db_async(make_device)("glasses")
        data = picture(64, 48)
        done, image_id = await send_photo_then_ask(glasses, data, "看看这是什么")
    finally:
        image_store.unregister_image_analyzer(analyzer)
    assert done["type"] == "reply.done"
    # The checker removed the payment claim no receipt backs, as for every reply.
    assert done["text"] == "这是一只白色的杯子。"
    request = brain.script.requests[-1]
    assert request["model"] == "vision-demo" and "tools" not in request
    content = request["messages"][-1]["content"]
    assert content[0] == {"type": "text", "text": "看看这是什么"}
    assert content[1] == {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(data).decode()}}
    assert "People recognized in the image (enrolled by the owner): 王阿姨" in request["messages"][-2]["content"]
    image = await db_async(ImageRecord.objects.get)(id=image_id)
    assert image.people == [{"name": "王阿姨", "score": 0.9}] and image.state == "attached"  # the owner's photo is kept


async def test_the_demo_brain_says_it_received_an_image_it_cannot_see(make_device: Any, brain: Any) -> None:
    await db_async(use_vision)(brain.base_url)
    phone = await db_async(make_device)("phone")
    # No about link: "what is this" right after a photo from the same device.
    done, _ = await send_photo_then_ask(phone, picture(80, 60, "PNG"), "what is this?", about=False)
    assert done["type"] == "reply.done"
    assert done["text"].startswith("[demo brain] I received an image of 80×60 (png, ")
    assert "I can't see it: I am not a model." in done["text"]
    # The faces analyzer ran (no face model here): nobody is named, and the model is told not to guess.
    assert "never guess who anyone in it is" in brain.script.requests[-1]["messages"][-2]["content"]


async def test_without_a_vision_role_she_says_so_instead_of_guessing(make_device: Any, brain: Any) -> None:
    phone = await db_async(make_device)("phone")
    done, _ = await send_photo_then_ask(phone, picture(), "这是什么")
    assert done["type"] == "reply.done" and done["text"] == vision.NOT_CONFIGURED
    assert brain.script.requests == []  # no model was asked to guess


async def test_a_request_that_is_not_about_an_image_goes_to_the_main_turn(make_device: Any, brain: Any) -> None:
    await db_async(use_vision)(brain.base_url)
    phone = await db_async(make_device)("phone")
    done, _ = await send_photo_then_ask(phone, picture(), "明天会下雨吗", about=False)
    assert done["type"] == "reply.done"
    assert brain.script.requests[-1]["model"] == "yimi-demo"
    assert all(isinstance(m.get("content"), str | None) for m in brain.script.requests[-1]["messages"])


# --- retention -------------------------------------------------------------------------------------


async def test_a_guests_photo_is_deleted_once_its_request_ended(make_device: Any, brain: Any, data_dir: Path) -> None:
    await db_async(use_vision)(brain.base_url)
    guest = await db_async(make_device)("phone", guest=True)
    done, image_id = await send_photo_then_ask(guest, picture(), "what is this")
    assert done["type"] == "reply.done" and "I received an image" in done["text"]
    image = await db_async(ImageRecord.objects.get)(id=image_id)
    assert image.scope == "guest" and image.retention == "request"
    assert image.state == "purged" and image.path == "" and image.purged_at is not None
    assert stored_files(data_dir) == []


async def test_a_guests_photo_the_owner_asked_to_keep_is_kept(make_device: Any, brain: Any, data_dir: Path) -> None:
    await db_async(use_vision)(brain.base_url)
    guest = await db_async(make_device)("phone", guest=True)
    image_id = (await db_async(upload)(guest, picture())).json()["image_id"]
    assert await db_async(image_store.keep_image)(guest.device.owner_id, image_id)
    comm, _ = await open_socket(guest)
    await comm.send_json_to({"type": "image", "id": "p", "image_id": image_id, "about": "q"})
    await receive_until(comm, "image.ack")
    await comm.send_json_to({"type": "text", "id": "q", "text": "what is this"})
    assert (await receive_until(comm, "reply.done", "notice", timeout=20))["type"] == "reply.done"
    await comm.disconnect()
    image = await db_async(ImageRecord.objects.get)(id=image_id)
    assert image.state == "attached" and (data_dir / image.path).exists()


def test_the_faces_analyzer_is_registered_and_a_guests_photo_never_reaches_it(make_device: Any) -> None:
    """The faces module's analyzer runs on every attached image (VoiceConfig.ready); it
    looks only at the owner's images, so a guest's photo comes out with nobody named."""
    from voice import faces

    assert faces.image_analyzer in image_store._ANALYZERS
    guest = make_device("phone", guest=True)
    image_id = upload(guest, picture()).json()["image_id"]
    attached = image_store.attach_image(device=guest.device, scope="guest", image_id=image_id, client_id="p", captured_at=None)
    attached.image.refresh_from_db()
    assert attached.image.analyzed_at is not None and attached.image.people == []
