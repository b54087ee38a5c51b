from __future__ import annotations

import io
import re
import stat
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command

from accounts.models import PairingCode, User

pytestmark = pytest.mark.django_db(transaction=True)


def run_init(*args: str) -> str:
    out = io.StringIO()
    call_command("yimi_init", *args, stdout=out)
    return out.getvalue()


def test_yimi_init_creates_identity_owner_and_a_pairing_code_then_keeps_them(tmp_path: Path) -> None:
    first = run_init()
    assert "owner: created 'owner', password (shown once): " in first
    code = re.search(r"pairing code \(single use, valid 10 minutes\): (\S+)", first)
    assert code and re.fullmatch(r"[0-9A-Z]{4}-[0-9A-Z]{4}", code.group(1))
    key_file = Path(settings.DATA_DIR) / "instance_ed25519.pem"
    key_before = key_file.read_bytes()
    owner_before = User.objects.get(is_owner=True)

    second = run_init()
    assert "instance identity: kept" in second and "owner: kept (owner)" in second
    assert "password" not in second
    assert key_file.read_bytes() == key_before
    owner_after = User.objects.get(is_owner=True)
    assert owner_after.password == owner_before.password and User.objects.count() == 1
    assert PairingCode.objects.count() == 2


def test_instance_key_is_private() -> None:
    run_init("--no-pairing-code")
    path = Path(settings.DATA_DIR) / "instance_ed25519.pem"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_secret_key_is_generated_once_private_and_kept(tmp_path: Path) -> None:
    from yimi_project.secrets import load_or_create_secret_key

    first = load_or_create_secret_key(tmp_path)
    assert len(first) >= 50 and stat.S_IMODE((tmp_path / "django_secret_key").stat().st_mode) == 0o600
    assert load_or_create_secret_key(tmp_path) == first


def test_secrets_are_read_from_the_secrets_directory(tmp_path: Path) -> None:
    from yimi_project.secrets import read_secret

    (tmp_path / "brain_api_key").write_text("sk-test\n")
    assert read_secret(tmp_path, "brain_api_key") == "sk-test"
    assert read_secret(tmp_path, "absent") == ""


def test_owner_password_can_come_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "owner_password"
    secret.write_text("a long enough password\n")
    out = run_init("--owner-password-file", str(secret), "--no-pairing-code")
    assert "with the password from the file" in out and "shown once" not in out
    assert User.objects.get(is_owner=True).check_password("a long enough password")


def test_only_one_owner_can_exist(owner: Any) -> None:
    from django.db import IntegrityError

    with pytest.raises(IntegrityError):
        User.objects.create(username="second", is_owner=True)
