"""Owner powers belong to the owner account, not to whoever is a superuser: only the owner
pairs devices, only the owner's devices are admitted as the owner (text, voice, HTTP API),
and only the owner reads the owner's content in the admin."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.contrib import admin
from django.test import Client
from django.utils import timezone

from accounts import voice, voiceprint
from accounts.devices import issue_pairing_code
from accounts.models import AdmissionRecord, Device, PairingCode
from accounts.owner_admin import OwnerContentAdmin, PlatformAdmin
from accounts.services import text_admission, voice_admission
from accounts.voiceprint import EnrollmentSegment
from brain.services import accept_utterance
from memory.assertions import store as assertions
from tests.conftest import SimDevice, new_keypair
from yimi_project.errors import YimiError

pytestmark = pytest.mark.django_db
MODEL = "test-speaker@1"

# Every page of the admins that show the owner's content (changelists).
OWNER_CONTENT_PAGES = [
    "/admin/memory/timelineentry/",
    "/admin/memory/assertion/",
    "/admin/memory/assertion/needs-reevaluation/",
    "/admin/brain/run/",
    "/admin/brain/agenttask/",
    "/admin/schedules/reminder/",
    "/admin/schedules/schedule/",
    "/admin/schedules/watch/",
    "/admin/capabilities/toolcall/",
    "/admin/capabilities/receiptrecord/",
    "/admin/memory/assertion/speaking-preferences/",
    "/admin/consent/consentcard/",
    "/admin/consent/rememberedconsent/",
    "/admin/consent/ridepermission/",
    "/admin/payments/paymentintent/",
    "/admin/accounts/device/",
    "/admin/accounts/pairingcode/",
    "/admin/devices/delivery/",
    "/admin/voice/voiceutterance/",
    "/admin/llm/modelselection/",
    "/admin/accounts/admissionrecord/",
    "/admin/accounts/voiceprintenrollment/",
    "/admin/accounts/channelthreshold/",
    "/admin/accounts/trustwindow/",
    "/admin/accounts/voicecall/",
    "/admin/accounts/faceenrollment/",
    "/admin/accounts/user/",
]


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, settings: Any) -> None:
    settings.DATA_DIR = tmp_path


@pytest.fixture
def second_superuser(django_user_model: Any) -> Any:
    return django_user_model.objects.create_superuser("second-admin", password="pw-pw-pw-pw")


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def device_of(user: Any) -> SimDevice:
    """A non-guest device on another account — as a pairing code issued for that account
    used to make (before only the owner could issue codes)."""
    key, public = new_keypair()
    device = Device.objects.create(owner=user, name="second admin's phone", kind="phone", capture_channels=["phone_app"], public_key=public)
    return SimDevice(device=device, key=key)


def signed_get(sim: SimDevice, url: str) -> Any:
    return Client().get(url, **sim.signed("GET", url))


# --- pairing ----------------------------------------------------------------------------------


def test_a_second_superuser_cannot_issue_an_owner_pairing_code(owner: Any, second_superuser: Any) -> None:
    for for_guest in (False, True):
        with pytest.raises(YimiError) as err:
            issue_pairing_code(second_superuser, for_guest=for_guest)
        assert err.value.code == "forbidden"
    refused = logged_in(second_superuser).post("/admin/accounts/pairingcode/add/", {})
    assert refused.status_code == 403
    assert PairingCode.objects.count() == 0
    made = logged_in(owner).post("/admin/accounts/pairingcode/add/", {}, follow=True)
    assert made.status_code == 200 and "New pairing code" in made.content.decode()
    assert list(PairingCode.objects.values_list("owner_id", "for_guest")) == [(owner.id, False)]


# --- admission --------------------------------------------------------------------------------


def test_a_device_of_another_account_never_gets_owner_scope(owner: Any, second_superuser: Any, make_device: Any) -> None:
    theirs = device_of(second_superuser)
    # text (the websocket's path: brain.services.accept_utterance → text_admission)
    assert (text_admission(theirs.device).scope, text_admission(theirs.device).reason) == ("guest", "not_owner_device")
    accepted = accept_utterance(theirs.device, "c-1", "show me the owner's day")
    assert AdmissionRecord.objects.get(run__id=accepted.run_id).scope == "guest"
    # voice: even a voice that its own account's voiceprint verifies
    b = np.eye(80)[0]
    voiceprint.enroll_channel(second_superuser.id, "phone_app", MODEL, [EnrollmentSegment(b.tolist(), 2000)] * 5)
    decision = voice.decide_speaker(device=theirs.device, embedding=b, model_key=MODEL, voiced_ms=2000, started_at=timezone.now())
    assert (decision.scope, decision.reason) == ("guest", "not_owner_device")
    assert voice_admission(theirs.device, scope="owner", reason="voiceprint_verified").scope == "guest"
    issued = 1_700_000_000
    message = voice.trust_window_message(str(theirs.device.id), "att-x", "face_id", issued)
    with pytest.raises(YimiError) as err:
        voice.open_trust_window(
            theirs.device, attestation_id="att-x", method="face_id", issued_at=issued, signature=theirs.sign(message),
            now=datetime.fromtimestamp(issued, tz=UTC),
        )
    assert err.value.code == "forbidden"
    # the owner's own device is still the owner
    mine = make_device()
    assert text_admission(mine.device).scope == "owner"
    said = accept_utterance(mine.device, "c-2", "my private plans")
    # HTTP API: the other account's device reads none of the owner's memory or timeline
    assert signed_get(theirs, "/api/memory/assertions/").status_code == 403
    timeline = signed_get(theirs, "/api/timeline/")
    assert timeline.status_code == 200 and "my private plans" not in timeline.content.decode()
    assert said.entry.text in signed_get(mine, "/api/timeline/").content.decode()


# --- the admin --------------------------------------------------------------------------------


# The platform's own rows, which staff review (issue 18: "staff review packs in the admin"):
# pack switches, versions and candidates hold manifests and check results, not the owner's words.
PLATFORM_ADMINS = {"capabilities.RegisteredPack", "capabilities.PackCandidate"}


def test_every_admin_showing_owner_content_is_owner_only() -> None:
    """A new admin must opt in: everything registered is owner content except Django's groups
    and the reviewed platform admins above."""
    platform = set()
    for model, model_admin in admin.site._registry.items():
        if isinstance(model_admin, PlatformAdmin):
            platform.add(model._meta.label)
        elif model._meta.label != "auth.Group":
            assert isinstance(model_admin, OwnerContentAdmin), model._meta.label
    assert platform == PLATFORM_ADMINS


def test_only_the_owner_reads_owner_content_in_the_admin(owner: Any, second_superuser: Any, make_device: Any) -> None:
    phone = make_device()
    said = accept_utterance(phone.device, "c-1", "my secret diary line")
    belief = assertions.commit(
        assertions.CommitRequest(owner_id=owner.pk, request_id=uuid.uuid4().hex, predicate="preference.food",
                                 payload={"text": "secret taste"}, expected_version=0, actor="agent")
    ).assertion_id
    objects = [
        f"/admin/memory/timelineentry/{said.entry.pk}/change/",
        f"/admin/brain/run/{said.run_id}/change/",
        f"/admin/memory/assertion/{belief}/change/",
        f"/admin/memory/assertion/{belief}/forget/",
        f"/admin/accounts/device/{phone.device.pk}/change/",
        f"/admin/accounts/user/{owner.pk}/change/",
        f"/admin/accounts/user/{owner.pk}/password/",
    ]
    staff = logged_in(second_superuser)
    for url in OWNER_CONTENT_PAGES + objects:
        response = staff.get(url)
        assert response.status_code in (403, 404), (url, response.status_code)
        assert "secret" not in response.content.decode(), url
    index = staff.get("/admin/").content.decode()
    assert "Timeline entries" not in index and "Runs" not in index and "Devices" not in index
    assert staff.post(f"/admin/accounts/user/{owner.pk}/password/", {"password1": "taken-over-1", "password2": "taken-over-1"}).status_code == 403
    owner.refresh_from_db()
    assert owner.check_password("correct horse battery")

    mine = logged_in(owner)
    for url in OWNER_CONTENT_PAGES + objects:
        assert mine.get(url).status_code == 200, url
    assert "my secret diary line" in mine.get("/admin/memory/timelineentry/").content.decode()
    assert "Timeline entries" in mine.get("/admin/").content.decode()
