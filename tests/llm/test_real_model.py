"""A real model after the first start: the stored model settings stay the authority, `./yimi
up` starts the demo brain whenever a stored role points at it (``yimi_init
--demo-brain-ports-file``), an environment naming another brain gets one paragraph with the one
command that drafts the change (``manage.py model_settings draft``), and every port `./yimi up`
binds is checked before the owner password or a pairing code is printed."""

from __future__ import annotations

import io
import shlex
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from accounts.models import PairingCode
from accounts.services import get_owner
from llm import roles
from llm.models import ModelRoleDraft
from tests.support.ports import free_port

pytestmark = pytest.mark.django_db

REAL_MODEL = {"YIMI_BRAIN_BASE_URL": "http://127.0.0.1:11434/v1", "YIMI_BRAIN_MODEL": "qwen2.5:7b"}




@pytest.fixture
def instance(tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data directory of the test's own, an environment without any YIMI_BRAIN_*, and free
    ports for the web server and the demo brain."""
    settings.DATA_DIR = tmp_path / "data"
    settings.SECRETS_DIR = tmp_path / "secrets"
    settings.DATA_DIR.mkdir()
    settings.YIMI_PORT = free_port()
    settings.FAKE_BRAIN_PORT = free_port()
    settings.YIMI_INTERNAL_SOCKET = tmp_path / "internal.sock"
    for name in ("YIMI_BRAIN_BASE_URL", "YIMI_BRAIN_MODEL", "YIMI_BRAIN_PROVIDER", "YIMI_BRAIN_API_KEY",
                 "YIMI_VISION_BASE_URL", "YIMI_WORKSHOP_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def up(tmp_path: Path, *extra: str) -> tuple[str, list[int]]:
    """What `./yimi up` runs: yimi_init with the port checks; returns its output and the demo
    brain ports it names."""
    ports_file = tmp_path / "demo-brain-ports"
    out = io.StringIO()
    call_command("yimi_init", "--check-ports", "--demo-brain-ports-file", str(ports_file), *extra, stdout=out)
    return out.getvalue(), [int(line) for line in ports_file.read_text().split()]


def test_the_demo_brain_starts_whenever_a_stored_role_points_at_it_whatever_the_environment_says(
    instance: Path, settings: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, ports = up(instance)
    assert ports == [settings.FAKE_BRAIN_PORT]
    assert "model settings: imported from the environment (brain)" in first

    for name, value in REAL_MODEL.items():  # step 2 of a newcomer: a model set after the first start
        monkeypatch.setenv(name, value)
    second, ports = up(instance)
    assert ports == [settings.FAKE_BRAIN_PORT]  # the stored brain role still points at it, so it runs
    assert roles.stored("brain").provider == roles.DEMO_PROVIDER  # and the environment changed nothing


def test_a_stored_real_model_starts_no_demo_brain(instance: Path) -> None:
    up(instance)
    roles.apply("brain", provider="ollama", base_url="http://127.0.0.1:11434/v1", model="qwen2.5:7b", options={}, source="draft")
    assert up(instance)[1] == []


def test_the_demo_brain_starts_where_the_stored_role_points_not_where_the_environment_says(instance: Path, settings: Any) -> None:
    stored_port = settings.FAKE_BRAIN_PORT
    up(instance)
    settings.FAKE_BRAIN_PORT = free_port()  # YIMI_FAKE_BRAIN_PORT changed after the first start
    out, ports = up(instance)
    assert ports == [stored_port]
    assert f"demo brain: on port {stored_port}, where the stored model settings point" in out


def test_an_environment_naming_another_brain_gets_the_one_command_that_drafts_it(
    instance: Path, monkeypatch: pytest.MonkeyPatch, fake_brain: Any,
) -> None:
    up(instance)
    base_url = fake_brain.base_url  # a second OpenAI-compatible server: the "real model" here
    monkeypatch.setenv("YIMI_BRAIN_BASE_URL", base_url)
    monkeypatch.setenv("YIMI_BRAIN_MODEL", "real-model")
    out, _ = up(instance)
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("model settings: the environment names"))
    paragraph, command = lines[start], lines[start + 1]
    assert f"the brain {base_url} (model real-model)" in paragraph
    assert f"the stored brain role, which Yimi uses, is {roles.stored('brain').base_url} (model yimi-demo, the demo brain)" in paragraph
    assert command.startswith("  ") and "model_settings draft brain" in command
    assert not ModelRoleDraft.objects.exists()  # told, nothing drafted or changed yet

    argv = shlex.split(command)
    drafted = io.StringIO()
    call_command(*argv[argv.index("model_settings"):], stdout=drafted)
    draft = ModelRoleDraft.objects.get()
    assert (draft.role, draft.base_url, draft.model, draft.state) == ("brain", base_url, "real-model", "open")
    assert draft.created_by == "owner_console" and draft.probe_status == "ok"
    assert "confirm it on your phone or Mac" in drafted.getvalue() and str(draft.id) in drafted.getvalue()
    assert roles.stored("brain").provider == roles.DEMO_PROVIDER  # the owner confirms; the command does not apply


def test_the_environment_naming_the_stored_brain_says_nothing(instance: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in REAL_MODEL.items():
        monkeypatch.setenv(name, value)
    up(instance)  # the first start imports it
    out, ports = up(instance)
    assert "the environment names" not in out and ports == []


def test_the_drafting_command_names_where_the_key_comes_from_never_the_key(
    instance: Path, settings: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    up(instance)
    settings.SECRETS_DIR.mkdir()
    (settings.SECRETS_DIR / "brain_api_key").write_text("sk-secret-value\n")
    for name, value in REAL_MODEL.items():
        monkeypatch.setenv(name, value)
    out, _ = up(instance)
    assert f"--api-key-file {settings.SECRETS_DIR / 'brain_api_key'}" in out
    assert "sk-secret-value" not in out


def test_the_draft_command_refuses_bad_input_and_drafts_nothing(instance: Path, tmp_path: Path) -> None:
    up(instance)
    with pytest.raises(CommandError, match="invalid_model_settings"):
        call_command("model_settings", "draft", "brain", "--base-url", "ftp://example.com", "--model", "m", stdout=io.StringIO())
    with pytest.raises(CommandError, match="unknown_role"):
        call_command("model_settings", "draft", "chef", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", stdout=io.StringIO())
    (tmp_path / "empty").write_text("")
    with pytest.raises(CommandError, match="is empty; no draft was made"):
        call_command("model_settings", "draft", "brain", "--base-url", "http://127.0.0.1:1/v1", "--model", "m",
                     "--api-key-file", str(tmp_path / "empty"), stdout=io.StringIO())
    assert not ModelRoleDraft.objects.exists()


@pytest.mark.parametrize("which", ["web", "demo brain", "cold storage"])
def test_every_port_is_checked_before_the_owner_password_or_a_pairing_code(
    instance: Path, settings: Any, taken_port: int, which: str,
) -> None:
    """A first start: nothing secret may be printed before the last port check passes."""
    extra: list[str] = ["--cold-webdav-port", str(free_port())]
    if which == "web":
        settings.YIMI_PORT = taken_port
    elif which == "demo brain":
        settings.FAKE_BRAIN_PORT = taken_port  # where the first start stores the demo brain
    else:
        extra = ["--cold-webdav-port", str(taken_port)]
    out = io.StringIO()
    with pytest.raises(CommandError, match=f"port {taken_port} on 127.0.0.1"):
        call_command("yimi_init", "--check-ports", *extra, stdout=out)
    assert "password" not in out.getvalue() and "pairing code" not in out.getvalue()
    assert get_owner() is None and not PairingCode.objects.exists()
    with override_settings(YIMI_PORT=free_port(), FAKE_BRAIN_PORT=free_port()):
        if which != "demo brain":  # the stored role keeps the taken demo brain port; the others are free now
            call_command("yimi_init", "--check-ports", "--cold-webdav-port", str(free_port()), stdout=out)
            assert "password (shown once)" in out.getvalue() and PairingCode.objects.count() == 1
