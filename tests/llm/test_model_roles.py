"""Model roles (llm.roles): the first-start import, fallbacks, provider keys sealed under
the master key, backup and restore with the wrapped key, key rotation, the console page,
and the rule that a change applied mid-run takes effect for the next run only."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from brain.agent_loop import execute_agent_task
from brain.models import Run
from brain.runner import execute_run
from brain.services import accept_utterance
from llm import keyring, role_backup, roles
from llm.fake_server import FakeBrainServer
from llm.models import ModelRole, ModelRoleRevision, ModelSettingsImport
from tests.conftest import MID_RUN_RULES, CallbackScript, db_async, new_client_id, use_brain
from yimi_project.errors import YimiError
from yimi_project.logs import JsonFormatter

KEY = "sk-live-7d1f0c2e9a4b4f53a1c6"
OTHER_KEY = "sk-vision-3b9e1d2c7f6a"
PASSPHRASE = "correct horse battery staple"

FIRST_ENV = {
    "YIMI_BRAIN_BASE_URL": "https://api.deepseek.com/v1",
    "YIMI_BRAIN_MODEL": "deepseek-chat",
    "YIMI_BRAIN_API_KEY": KEY,
    "YIMI_BRAIN_THINKING_FIELD": "enable_thinking",
    "YIMI_BRAIN_TIMEOUT_SECONDS": "45",
    "YIMI_VISION_BASE_URL": "https://api.siliconflow.cn/v1",
    "YIMI_VISION_MODEL": "THUDM/GLM-4.1V-9B-Thinking",
    "YIMI_VISION_API_KEY": OTHER_KEY,
}


@pytest.fixture
def keys(tmp_path: Path, settings: Any) -> Path:
    """A data and a secrets directory of this test's own, with a master key made the way
    ``yimi_init`` makes it."""
    settings.DATA_DIR = tmp_path / "data"
    settings.SECRETS_DIR = tmp_path / "secrets"
    settings.DATA_DIR.mkdir()
    settings.SECRETS_DIR.mkdir()
    assert keyring.ensure_master_key() is True
    return keyring.master_key_path()


# --- first start --------------------------------------------------------------------------------


def test_the_environment_is_imported_at_first_start_only(db: Any, keys: Path) -> None:
    assert roles.import_from_environment(FIRST_ENV) == ["brain", "vision"]
    changed = {**FIRST_ENV, "YIMI_BRAIN_BASE_URL": "https://other.example/v1", "YIMI_BRAIN_MODEL": "other", "YIMI_BRAIN_API_KEY": "sk-other"}
    assert roles.import_from_environment(changed) is None  # the second start
    brain = roles.resolve("brain")
    assert (brain.base_url, brain.model, brain.api_key, brain.provider) == ("https://api.deepseek.com/v1", "deepseek-chat", KEY, "api.deepseek.com")
    assert (brain.thinking_field, brain.timeout_seconds, brain.source, brain.version) == ("enable_thinking", 45.0, "environment", 1)
    assert roles.resolve("vision").api_key == OTHER_KEY
    assert ModelRole.objects.count() == 2 and ModelSettingsImport.objects.get().roles == ["brain", "vision"]


def test_without_a_brain_in_the_environment_the_first_start_uses_the_demo_brain(db: Any, keys: Path, settings: Any) -> None:
    roles.import_from_environment({})
    brain = roles.resolve("brain")
    assert brain.base_url == f"http://127.0.0.1:{settings.FAKE_BRAIN_PORT}/v1" and brain.model == "yimi-demo"
    assert brain.api_key is None and ModelRole.objects.get(role="brain").source_note == roles.DEMO_NOTE


def test_a_key_file_wins_over_the_variable_and_a_bad_value_imports_nothing(db: Any, keys: Path, settings: Any) -> None:
    with pytest.raises(YimiError) as err:
        roles.import_from_environment({**FIRST_ENV, "YIMI_BRAIN_TIMEOUT_SECONDS": "soon"})
    assert err.value.code == "invalid_model_settings"
    assert not ModelRole.objects.exists() and not ModelSettingsImport.objects.exists()  # the next start tries again
    (Path(settings.SECRETS_DIR) / "brain_api_key").write_text("sk-from-file\n")
    roles.import_from_environment(FIRST_ENV)
    assert roles.resolve("brain").api_key == "sk-from-file"


def test_yimi_init_creates_the_master_key_and_imports_once(db: Any, tmp_path: Path, settings: Any, monkeypatch: Any) -> None:
    settings.DATA_DIR = tmp_path
    settings.SECRETS_DIR = tmp_path / "no-secrets"
    for name, value in FIRST_ENV.items():
        monkeypatch.setenv(name, value)
    call_command("yimi_init", "--no-pairing-code", stdout=(out := _Out()))
    assert "model master key: created" in out.text and "imported from the environment (brain, vision)" in out.text
    assert (tmp_path / "model_master_key").stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv("YIMI_BRAIN_MODEL", "changed-later")
    call_command("yimi_init", "--no-pairing-code", stdout=(out := _Out()))
    assert "model master key: kept" in out.text and "model settings: kept" in out.text
    assert roles.resolve("brain").model == "deepseek-chat"


# --- fallback -----------------------------------------------------------------------------------


def test_roles_without_settings_fall_back_to_the_brain_or_are_not_configured(db: Any, keys: Path) -> None:
    roles.import_from_environment(FIRST_ENV)
    for role in ("delegation", "executor_fast", "executor_thorough", "workshop_repair"):
        found = roles.resolve(role)
        assert (found.role, found.configured_as, found.model) == (role, "brain", "deepseek-chat")
    for role in ("realtime", "tts", "asr_remote"):
        with pytest.raises(YimiError) as err:
            roles.resolve(role)
        assert err.value.code == "role_not_configured"
    roles.apply("delegation", provider="p", base_url="https://d.example/v1", model="small", options={}, source="console")
    assert roles.resolve("delegation").configured_as == "delegation"
    with pytest.raises(YimiError) as err:
        roles.resolve("painter")
    assert err.value.code == "unknown_role"


def test_bad_settings_are_refused_and_change_nothing(db: Any, keys: Path) -> None:
    roles.import_from_environment(FIRST_ENV)
    for bad in (
        {"base_url": "ftp://x/v1"}, {"base_url": "https://user:pw@x.example/v1"}, {"model": ""},
        {"options": {"timeout_seconds": 0}}, {"options": {"max_tokens": 0}}, {"options": {"colour": "red"}},
        {"options": {"thinking_field": "bad field"}}, {"source": "rumour"},
    ):
        args = {"provider": "p", "base_url": "https://x.example/v1", "model": "m", "options": {}, "source": "console", **bad}
        with pytest.raises(YimiError) as err:
            roles.apply("brain", **args)
        assert err.value.code == "invalid_model_settings"
    assert roles.resolve("brain").version == 1 and ModelRoleRevision.objects.filter(role="brain").count() == 1


# --- the keys -------------------------------------------------------------------------------------


def test_a_provider_key_is_stored_encrypted_and_decrypts_only_for_its_role(db: Any, keys: Path) -> None:
    roles.import_from_environment(FIRST_ENV)
    row = ModelRole.objects.get(role="brain")
    assert row.api_key_encrypted and KEY not in row.api_key_encrypted
    assert row.api_key_encrypted.startswith(f"v1:{keyring.key_id(keyring.master_key())}:")
    assert keyring.decrypt(row.api_key_encrypted, roles.key_aad("brain")) == KEY
    with pytest.raises(YimiError) as err:  # the same blob under another role's name
        keyring.decrypt(row.api_key_encrypted, roles.key_aad("vision"))
    assert err.value.code == "model_key_undecryptable"
    roles.apply("brain", provider="p", base_url="https://x.example/v1", model="m2", options={}, source="console")
    assert roles.resolve("brain").api_key == KEY  # KEEP: the stored key stays
    roles.apply("brain", provider="p", base_url="https://x.example/v1", model="m3", options={}, api_key=None, source="console")
    assert roles.resolve("brain").api_key is None and roles.resolve("brain").version == 3
    assert OTHER_KEY not in repr(roles.resolve("vision")) and OTHER_KEY not in str(roles.resolve("vision"))


def test_without_the_master_key_keys_are_refused(db: Any, keys: Path) -> None:
    roles.import_from_environment(FIRST_ENV)
    keys.unlink()
    with pytest.raises(YimiError) as err:
        roles.resolve("brain")
    assert err.value.code == "model_master_key_missing"
    with pytest.raises(YimiError) as err:
        roles.apply("brain", provider="p", base_url="https://x.example/v1", model="m", options={}, api_key="sk-new", source="console")
    assert err.value.code == "model_master_key_missing"
    assert ModelRole.objects.get(role="brain").version == 1  # nothing changed


def test_under_another_master_key_keys_do_not_decrypt(db: Any, keys: Path) -> None:
    roles.import_from_environment(FIRST_ENV)
    keys.write_bytes(keyring.encode_key(keyring.new_master_key()))
    with pytest.raises(YimiError) as err:
        roles.resolve("brain")
    assert err.value.code == "model_key_undecryptable"
    keys.write_text("not a key")
    with pytest.raises(YimiError) as err:
        roles.resolve("brain")
    assert err.value.code == "model_master_key_invalid"


def test_a_missing_master_key_stops_the_first_import_of_a_key(db: Any, keys: Path) -> None:
    keys.unlink()
    with pytest.raises(YimiError) as err:
        roles.import_from_environment(FIRST_ENV)
    assert err.value.code == "model_master_key_missing"
    assert not ModelSettingsImport.objects.exists() and not ModelRole.objects.exists()


# --- backup and restore -----------------------------------------------------------------------------


def _export(tmp_path: Path, name: str = "backup.json") -> Path:
    passphrase_file = tmp_path / "passphrase"
    passphrase_file.write_text(PASSPHRASE + "\n")
    target = tmp_path / name
    call_command("model_settings", "export", str(target), "--passphrase-file", str(passphrase_file), stdout=_Out())
    return target


def _import(tmp_path: Path, backup: Path, passphrase: str = PASSPHRASE) -> str:
    passphrase_file = tmp_path / "passphrase-in"
    passphrase_file.write_text(passphrase)
    out = _Out()
    call_command("model_settings", "import", str(backup), "--passphrase-file", str(passphrase_file), stdout=out)
    return out.text


def test_export_then_import_into_a_fresh_instance_restores_settings_and_keys(db: Any, keys: Path, tmp_path: Path) -> None:
    roles.import_from_environment(FIRST_ENV)
    roles.apply("workshop_repair", provider="w", base_url="https://w.example/v1", model="fixer", options={"max_tokens": 4096},
                api_key="sk-workshop-1", source="console")
    backup = _export(tmp_path)
    text = backup.read_text()
    assert keys.read_text().strip() not in text and KEY not in text and "sk-workshop-1" not in text
    assert backup.stat().st_mode & 0o777 == 0o600
    # A fresh instance: empty tables, its own master key (yimi_init made it).
    ModelRole.objects.all().delete()
    ModelRoleRevision.objects.all().delete()
    ModelSettingsImport.objects.all().delete()
    keys.unlink()
    keyring.ensure_master_key()
    assert "restored model roles: brain, vision, workshop_repair" in _import(tmp_path, backup)
    assert roles.resolve("brain").api_key == KEY and roles.resolve("vision").api_key == OTHER_KEY
    workshop = roles.resolve("workshop_repair")
    assert (workshop.model, workshop.max_tokens, workshop.api_key, workshop.source) == ("fixer", 4096, "sk-workshop-1", "import")
    assert roles.import_from_environment({"YIMI_BRAIN_BASE_URL": "https://late.example/v1", "YIMI_BRAIN_MODEL": "late"}) is None


def test_a_backup_without_the_wrapped_key_or_with_a_wrong_passphrase_is_refused(db: Any, keys: Path, tmp_path: Path) -> None:
    roles.import_from_environment(FIRST_ENV)
    backup = _export(tmp_path)
    document = json.loads(backup.read_text())
    del document["master_key"]
    stripped = tmp_path / "stripped.json"
    stripped.write_text(json.dumps(document))
    roles.apply("brain", provider="p", base_url="https://now.example/v1", model="now", options={}, source="console")
    before = list(ModelRole.objects.values_list("role", "version", "api_key_encrypted", "model").order_by("role"))
    with pytest.raises(CommandError) as err:
        _import(tmp_path, stripped)
    assert "no wrapped master key" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(CommandError) as err:
        _import(tmp_path, backup, passphrase="wrong passphrase")
    assert "passphrase does not open" in str(err.value) and "nothing was changed" in str(err.value)
    assert list(ModelRole.objects.values_list("role", "version", "api_key_encrypted", "model").order_by("role")) == before
    with pytest.raises(CommandError, match="exists"):
        _export(tmp_path)  # never overwrites a backup


# --- rotation -------------------------------------------------------------------------------------------


def test_rotating_the_master_key_rewraps_every_key(db: Any, keys: Path) -> None:
    roles.import_from_environment(FIRST_ENV)
    roles.apply("brain", provider="p", base_url="https://x.example/v1", model="m2", options={}, api_key="sk-second", source="console")
    old = keyring.master_key()
    call_command("model_settings", "rotate-key", stdout=(out := _Out()))
    new = keyring.master_key()
    assert new != old and keyring.key_id(new) in out.text and keys.stat().st_mode & 0o777 == 0o600
    sealed = [(r.role, r.api_key_encrypted) for m in (ModelRole, ModelRoleRevision) for r in m.objects.exclude(api_key_encrypted=None)]
    assert len(sealed) == 5  # brain, vision; revisions brain v1, v2, vision v1
    for role, blob in sealed:
        keyring.decrypt(blob, roles.key_aad(role), key=new)
        with pytest.raises(YimiError):
            keyring.decrypt(blob, roles.key_aad(role), key=old)
    assert roles.resolve("brain").api_key == "sk-second" and roles.resolve("vision").api_key == OTHER_KEY
    assert not list(keys.parent.glob(".model_master_key*"))


def test_rotating_the_master_key_rewraps_an_open_drafts_new_key(db: Any, keys: Path) -> None:
    from llm import role_drafts

    roles.import_from_environment(FIRST_ENV)
    draft, _ = role_drafts.create_draft(
        "brain", provider="p", base_url="https://x.example/v1", model="m3", options={}, api_key="sk-drafted", created_by="owner_console",
    )
    role_backup.rotate_master_key()
    draft.refresh_from_db()
    assert role_drafts.probe_key(draft) == "sk-drafted"  # opened under the new master key


def test_a_failed_rotation_keeps_the_old_key_file_and_blobs(db: Any, keys: Path) -> None:
    roles.import_from_environment(FIRST_ENV)
    ModelRole.objects.filter(role="vision").update(api_key_encrypted="v1:0000:AAAA")  # one blob that cannot be opened
    before_file = keys.read_bytes()
    before = dict(ModelRole.objects.values_list("role", "api_key_encrypted"))
    with pytest.raises(CommandError, match="model_key_undecryptable"):
        call_command("model_settings", "rotate-key", stdout=_Out())
    assert keys.read_bytes() == before_file and dict(ModelRole.objects.values_list("role", "api_key_encrypted")) == before
    assert roles.resolve("brain").api_key == KEY


# --- the key never shows ---------------------------------------------------------------------------------


def test_the_key_is_never_in_the_console_or_the_logs(db: Any, keys: Path, owner: Any, client: Any, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="yimi")
    roles.import_from_environment(FIRST_ENV)
    roles.apply("brain", provider="p", base_url="https://x.example/v1", model="m2", options={}, api_key="sk-second-9f8e", source="console")
    roles.resolve("brain")
    role_backup.rotate_master_key()
    client.force_login(owner)
    page = client.get("/admin/llm/modelrole/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "imported from the environment at first start on" in html and "set in the console" in html
    assert "Changes are drafts confirmed on a device" in html and '<td class="key">set</td>' in html
    for secret in (KEY, OTHER_KEY, "sk-second-9f8e", keys.read_text().strip()):
        assert secret not in html
    lines = [JsonFormatter().format(r) for r in caplog.records]
    assert any("model_role_applied" in line for line in lines) and any("model_master_key_rotated" in line for line in lines)
    for secret in (KEY, OTHER_KEY, "sk-second-9f8e", keys.read_text().strip()):
        assert not any(secret in line for line in lines)
    # The read-only view of the row itself (the owner has view permission, no change
    # permission): it renders, and shows no key either.
    row = client.get(f"/admin/llm/modelrole/{ModelRole.objects.get(role='brain').pk}/change/")
    assert row.status_code == 200
    for secret in (KEY, OTHER_KEY, "sk-second-9f8e", keys.read_text().strip()):
        assert secret not in row.content.decode()


def test_the_console_lists_every_role_with_its_source_and_key_state(db: Any, keys: Path) -> None:
    roles.import_from_environment(FIRST_ENV)
    rows = {r.role: r for r in roles.overview()}
    assert list(rows) == list(roles.ROLES)
    assert rows["brain"].key_state == "set" and rows["brain"].source_text.startswith("imported from the environment at first start on ")
    assert rows["delegation"].source_text == "not configured: uses brain" and rows["tts"].source_text == "not configured"


# --- a change applied mid-run waits for the next run ----------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_a_change_applied_mid_run_takes_effect_for_the_next_run_only(make_device: Any, settings: Any, tmp_path: Path) -> None:
    settings.YIMI_PACKS_DIR = tmp_path / "no-packs"
    settings.YIMI_PACKS_DIR.mkdir()

    def apply_new_model(number: int) -> None:
        if number == 2:  # the sub-agent's first request: the run is under way
            try:
                roles.apply("brain", provider="demo", base_url=server.base_url, model="model-new", options={"timeout_seconds": 10.0},
                            source="draft", note="confirmed mid-run")
            finally:
                connection.close()  # this handler thread's own connection

    server = FakeBrainServer(script=CallbackScript(MID_RUN_RULES, apply_new_model))
    server.start_in_thread()
    try:
        await db_async(use_brain)(server.base_url, timeout_seconds=10.0)
        sim = await db_async(make_device)()
        first = await db_async(accept_utterance)(sim.device, new_client_id(), "hello")
        assert await execute_run(first.run_id) == "succeeded"  # request 1: the main turn
        from brain import agents

        task = await db_async(agents.delegate)(first.run_id, "errand")
        assert await execute_agent_task(task.id) == "succeeded"  # requests 2, 3 (sub-agent), 4 (report)
        models = [r["model"] for r in server.script.requests]
        assert models == ["yimi-demo"] * 4, models  # applied during request 2, yet the run kept its model
        assert (await db_async(lambda: roles.resolve("brain").model)()) == "model-new"
        second = await db_async(accept_utterance)(sim.device, new_client_id(), "hello again")
        assert await execute_run(second.run_id) == "succeeded"
        assert server.script.requests[-1]["model"] == "model-new"  # the next run
        pins = await db_async(lambda: dict(Run.objects.values_list("id", "model_roles")))()
        assert pins[first.run_id]["brain"]["version"] + 1 == pins[second.run_id]["brain"]["version"]
    finally:
        server.shutdown()
        server.server_close()


class _Out(io.StringIO):
    @property
    def text(self) -> str:
        return self.getvalue()
