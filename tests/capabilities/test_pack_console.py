"""Packs in the owner console (issue: "registered packs show 0 until a manage.py pack
command runs; the console cannot turn a pack on"). A fresh instance lists its shipped
packs; the owner turns one on and off with the row's buttons, through the registry's one
writer (``capabilities.registry.set_enabled``), and the loader serves the change at once.
``YIMI_PACKS_DISABLE`` still wins, and the page says so."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.test import Client

from capabilities.manifest import load_packs
from capabilities.registry_models import PackVersion, RegisteredPack

pytestmark = pytest.mark.django_db

PACK = "mijia"  # a shipped pack that is off by default (its manifest)


@pytest.fixture(autouse=True)
def registry(tmp_path: Path, settings: Any) -> None:
    settings.YIMI_PACK_REGISTRY_DIR = tmp_path / "registry"
    settings.YIMI_PACKS_ENABLE, settings.YIMI_PACKS_DISABLE = [], []


def shipped_names() -> set[str]:
    return {p.parent.name for p in Path(django_settings.YIMI_PACKS_DIR).glob("*/plugin.json")}


def owner_client(owner: Any) -> Client:
    client = Client()
    client.force_login(owner)
    return client


def switch(client: Client, name: str, value: str) -> list[str]:
    pk = RegisteredPack.objects.get(name=name).pk
    response = client.post(f"/admin/capabilities/registeredpack/{pk}/switch/", {"switch": value}, follow=True)
    assert response.status_code == 200
    return [str(m) for m in response.context["messages"]]


def test_a_fresh_instance_lists_its_shipped_packs_without_any_command(owner: Any) -> None:
    assert RegisteredPack.objects.count() == 0
    page = owner_client(owner).get("/admin/capabilities/registeredpack/").content.decode()
    assert set(RegisteredPack.objects.values_list("name", flat=True)) == shipped_names()
    assert f"{len(shipped_names())} registered packs" in page and PACK in page
    assert "YIMI_PACKS_DISABLE (the deployment&#x27;s) wins over it" in page
    versions = PackVersion.objects.count()
    owner_client(owner).get("/admin/capabilities/registeredpack/")
    assert PackVersion.objects.count() == versions  # read again: nothing new recorded


def test_yimi_init_registers_the_shipped_packs(transactional_db: Any) -> None:
    out = io.StringIO()
    call_command("yimi_init", "--no-pairing-code", stdout=out)
    assert f"packs: {len(shipped_names())} registered" in out.getvalue()
    assert set(RegisteredPack.objects.values_list("name", flat=True)) == shipped_names()


def test_the_owner_turns_a_pack_on_then_off_and_the_loader_follows_at_once(owner: Any) -> None:
    client = owner_client(owner)
    client.get("/admin/capabilities/registeredpack/")
    assert PACK in load_packs().disabled
    assert switch(client, PACK, "on") == [f"{PACK}: switch on; the pack is on"]
    assert RegisteredPack.objects.get(name=PACK).enabled is True and PACK in load_packs().packs
    assert switch(client, PACK, "off") == [f"{PACK}: switch off; the pack is off: turned off in the pack registry"]
    assert RegisteredPack.objects.get(name=PACK).enabled is False and PACK not in load_packs().packs
    switch(client, PACK, "default")
    assert RegisteredPack.objects.get(name=PACK).enabled is None
    assert load_packs().disabled[PACK] == f"off by default; YIMI_PACKS_ENABLE={PACK} turns it on"


def test_yimi_packs_disable_wins_over_the_consoles_switch_and_the_owner_is_told(owner: Any, settings: Any) -> None:
    settings.YIMI_PACKS_DISABLE = [PACK]
    client = owner_client(owner)
    client.get("/admin/capabilities/registeredpack/")
    assert switch(client, PACK, "on") == [f"{PACK}: switch on; the pack is off: turned off by YIMI_PACKS_DISABLE"]
    assert PACK not in load_packs().packs


def test_a_bad_switch_value_is_refused_and_changes_nothing(owner: Any) -> None:
    client = owner_client(owner)
    client.get("/admin/capabilities/registeredpack/")
    assert switch(client, PACK, "maybe") == [f"{PACK}: invalid_request: the switch is on, off or default, not 'maybe'"]
    assert RegisteredPack.objects.get(name=PACK).enabled is None
    pk = RegisteredPack.objects.get(name=PACK).pk
    assert client.get(f"/admin/capabilities/registeredpack/{pk}/switch/").status_code == 405
