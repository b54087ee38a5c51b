"""``VoiceUtterance`` moved from the devices app to the voice app, table and rows in place:
an instance installed before the move migrates forward and reads its utterances through
the voice app's model (voice/migrations/0001_initial.py, devices/migrations/0010_...).

The database is taken back to the migrations before the move (devices 0009, no voice
app), a row is written with the historical devices model, and the migrations are applied
again to the leaves."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from voice.models import VoiceUtterance

BEFORE_THE_MOVE = [("devices", "0009_push_to_talk_holds"), ("voice", None)]

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_utterance_recorded_before_the_move_is_read_through_the_voice_app() -> None:
    moved_type = ContentType.objects.get(app_label="voice", model="voiceutterance")
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE_THE_MOVE)

    old = MigrationExecutor(connection).loader.project_state([("devices", "0009_push_to_talk_holds")]).apps
    # The content type went back with the state (the permissions keep pointing at it).
    assert old.get_model("contenttypes", "ContentType").objects.get(pk=moved_type.pk).app_label == "devices"
    owner = old.get_model("accounts", "User").objects.create(username="owner", is_owner=True)
    device = old.get_model("devices", "Device").objects.create(
        owner=owner, name="phone", kind="phone", public_key="k" * 43 + "=", capture_channels=["phone_app"]
    )
    utterance_id = uuid.uuid4()
    old.get_model("devices", "VoiceUtterance").objects.create(
        id=utterance_id, owner=owner, device=device, channel="phone_app", started_at=datetime(2026, 12, 1, tzinfo=UTC),
        stream_start_ms=0, stream_end_ms=1500, voiced_ms=1200, quality=0.9, scope="owner", reason="verified",
        disposition="ambient", transcript="the kettle is on",
    )

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    ContentType.objects.clear_cache()
    row = VoiceUtterance.objects.get(id=utterance_id)
    assert (row.device_id, row.transcript, row.disposition) == (device.id, "the kettle is on", VoiceUtterance.Disposition.AMBIENT)
    assert VoiceUtterance._meta.db_table == "devices_voiceutterance"
    # The same content type row, relabelled: staff permissions and admin log entries survive.
    assert ContentType.objects.get_for_model(VoiceUtterance).pk == moved_type.pk
    assert not ContentType.objects.filter(app_label="devices", model="voiceutterance").exists()
    assert Permission.objects.filter(content_type=moved_type, codename="view_voiceutterance").exists()
