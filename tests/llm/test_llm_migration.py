"""The llm app took brain's model tables over by state only (``llm/migrations/0001_initial.py``,
``brain/migrations/0018_model_settings_move_to_llm.py``): an installed instance upgrades in
place. Its rows stay in the tables they were in (``db_table``), and the models' content types
move from ``brain`` to ``llm`` with their ids, so staff permissions and admin log entries
keep pointing at them."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from llm.models import ModelRole, ModelRoleDraft, ModelRoleRevision, ModelSelection, ModelSettingsImport, ModelSwitch, ModelUsage

pytestmark = pytest.mark.django_db(transaction=True)

MOVED = ("modelrole", "modelrolerevision", "modelsettingsimport", "modelroledraft", "modelusage", "modelselection", "modelswitch")
TABLES = {
    ModelRole: "brain_modelrole", ModelRoleRevision: "brain_modelrolerevision", ModelSettingsImport: "brain_modelsettingsimport",
    ModelRoleDraft: "brain_modelroledraft", ModelUsage: "brain_modelusage",
    ModelSelection: "devices_modelselection", ModelSwitch: "devices_modelswitch",
}


def migrate(targets: list[tuple[str, str | None]]) -> Any:
    """Migrate the test database to ``targets``; the historical apps of the state reached."""
    executor = MigrationExecutor(connection)
    state = executor.migrate(targets)
    ContentType.objects.clear_cache()
    return state.apps


def test_every_moved_model_keeps_its_table() -> None:
    assert {model: model._meta.db_table for model in TABLES} == TABLES


def test_an_installed_instance_keeps_its_model_rows_and_content_types_when_llm_takes_them_over(make_device: Any) -> None:
    device = make_device().device  # devices' table is not part of the move
    leaves = MigrationExecutor(connection).loader.graph.leaf_nodes()
    try:
        # Back to the state before the llm app existed: the models are brain's.
        old = migrate([("llm", None)])
        before = {ct.model: ct.pk for ct in ContentType.objects.filter(app_label="brain", model__in=MOVED)}
        assert set(before) == set(MOVED)
        assert not ContentType.objects.filter(app_label="llm").exists()

        now = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
        fields = {"provider": "demo", "base_url": "http://127.0.0.1:9/v1", "model": "yimi-demo", "source": "console"}
        old.get_model("brain", "ModelRole").objects.create(role="brain", version=2, **fields)
        old.get_model("brain", "ModelRoleRevision").objects.create(role="brain", version=2, **fields)
        old.get_model("brain", "ModelSettingsImport").objects.create(id=1, imported_at=now, roles=["brain"])
        draft = old.get_model("brain", "ModelRoleDraft").objects.create(
            role="vision", provider="sf", base_url="http://127.0.0.1:9/v1", model="seeing", digest="d" * 64, created_by="yimi"
        )
        old.get_model("brain", "ModelUsage").objects.create(role="brain", provider="demo", model="yimi-demo", input_tokens=7)
        old.get_model("brain", "ModelSelection").objects.create(kind="vad", selected_id="silero-vad", selected_version="6", state="effective")
        old.get_model("brain", "ModelSwitch").objects.create(
            kind="vad", model_id="silero-vad", version="6", device_id=device.pk, issued_at=now, nonce="n" * 24, message="m", signature="s"
        )
    finally:
        migrate(leaves)

    # Read through the llm app's models: the same rows.
    assert ModelRole.objects.get(role="brain").version == 2
    assert ModelRoleRevision.objects.get(role="brain", version=2).model == "yimi-demo"
    assert ModelSettingsImport.objects.get(id=1).roles == ["brain"]
    assert ModelRoleDraft.objects.get(id=draft.id).model == "seeing"
    assert ModelUsage.objects.get().input_tokens == 7
    assert ModelSelection.objects.get(kind="vad").effective_key == "" and ModelSelection.objects.get(kind="vad").selected_key == "silero-vad@6"
    assert ModelSwitch.objects.get().device_id == device.pk

    # The content types moved, ids and all: permissions and admin log entries follow them.
    after = {ct.model: ct.pk for ct in ContentType.objects.filter(app_label="llm", model__in=MOVED)}
    assert after == before
    assert not ContentType.objects.filter(app_label="brain", model__in=MOVED).exists()
    assert ContentType.objects.get_for_model(ModelRole).pk == before["modelrole"]
    assert Permission.objects.get(codename="view_modelrole").content_type.app_label == "llm"
