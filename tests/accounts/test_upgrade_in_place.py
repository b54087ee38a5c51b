"""An installed instance upgrades in place across the restructure that moved models between
apps (device identity from devices to accounts; tables keep their names).

The database is taken back to the migrations an instance made before the restructure has
applied (``BEFORE``), rows are written through those historical models (as that instance
wrote them), the migrations are run forward, and the rows are read through today's models.
A staff permission on a moved model follows it (its content type is renamed, not recreated).
"""

from __future__ import annotations

import uuid

import pytest
from django.apps import apps as current_apps
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.support.migrations import BEFORE_RESTRUCTURE

BEFORE = BEFORE_RESTRUCTURE


def _migrate(targets: list[tuple[str, str | None]]):  # type: ignore[no-untyped-def]
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state([t for t in targets if t[1] is not None]).apps


def _latest() -> list[tuple[str, str]]:
    executor = MigrationExecutor(connection)
    return executor.loader.graph.leaf_nodes()


@pytest.mark.django_db(transaction=True)
def test_an_instance_made_before_the_moves_upgrades_in_place() -> None:
    latest = _latest()
    try:
        old = _migrate(BEFORE)
        # The instance as it was: its content type for devices.Device, a permission on it.
        ContentType.objects.clear_cache()
        ContentType.objects.filter(app_label="accounts", model="device").delete()
        ct, _ = ContentType.objects.get_or_create(app_label="devices", model="device")
        Permission.objects.get_or_create(content_type=ct, codename="view_device", defaults={"name": "Can view device"})

        User = old.get_model("accounts", "User")
        Device = old.get_model("devices", "Device")
        PairingCode = old.get_model("devices", "PairingCode")
        TimelineEntry = old.get_model("memory", "TimelineEntry")
        owner = User.objects.create(username="owner", is_owner=True)
        phone = Device.objects.create(
            id=uuid.uuid4(), owner=owner, name="phone", kind="phone", public_key="k" * 43 + "=",
        )
        PairingCode.objects.create(owner=owner, digest="d" * 64, expires_at="2030-01-01T00:00:00Z", used_by=phone)
        TimelineEntry.objects.create(owner=owner, seq=1, kind="utterance", text="你好", device=phone)

        _migrate(latest)
    finally:
        _migrate(latest)  # whatever happened, the next test gets today's schema

    Device = current_apps.get_model("accounts", "Device")
    device = Device.objects.get(name="phone")
    assert device.owner.username == "owner"
    assert current_apps.get_model("accounts", "PairingCode").objects.get(used_by=device).digest == "d" * 64
    entry = current_apps.get_model("memory", "TimelineEntry").objects.get(seq=1)
    assert entry.device_id == device.id and entry.device.name == "phone"
    ContentType.objects.clear_cache()
    moved = Permission.objects.get(codename="view_device")
    assert (moved.content_type.app_label, moved.content_type.model) == ("accounts", "device")
    assert not ContentType.objects.filter(app_label="devices", model="device").exists()
