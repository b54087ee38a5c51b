"""``manage.py pack`` (issue 18): an operator checks, publishes, inspects, switches and
reverts a pack, with progress on the long steps and a stable code on every refusal."""

from __future__ import annotations

from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from capabilities.manifest import load_packs
from capabilities.registry_models import PackCandidate
from tests.support.registry_support import CONTRACT, use_registry, write_candidate

pytestmark = pytest.mark.django_db


def pack(*args: str) -> str:
    out = StringIO()
    call_command("pack", *args, stdout=out)
    return out.getvalue()


def test_an_operator_checks_publishes_inspects_switches_and_reverts_a_pack(tmp_path: Path, settings: Any) -> None:
    use_registry(tmp_path, settings)
    source = write_candidate(tmp_path / "src")
    checked = pack("check", str(source), "--origin", "workshop")
    candidate = PackCandidate.objects.get()
    assert f"candidate {candidate.digest}" in checked and "passed" in checked
    assert "… honesty checks" in checked and "honesty real: 1/1 cases" in checked

    published = pack("publish", candidate.digest[:12])
    assert "… preloading" in published and "parcelcount 1.0.0" in published and "is online" in published
    status = pack("status")
    assert any(line.split()[:3] == ["parcelcount", "published", "on"] for line in status.splitlines())
    assert any(line.split()[:3] == ["demo", "shipped", "on"] for line in status.splitlines())

    assert "the pack is off (turned off in the pack registry)" in pack("switch", "parcelcount", "off")
    assert "parcelcount" not in load_packs().packs
    pack("switch", "parcelcount", "default")
    history = pack("status", "parcelcount")
    assert "switch default" in history and f"candidate {candidate.digest[:12]}" in history

    assert "the pack is removed" in pack("revert", "parcelcount", "--reason", "not wanted")
    with pytest.raises(CommandError, match="^nothing_to_revert: "):
        pack("revert", "parcelcount")


def test_refusals_carry_their_code(tmp_path: Path, settings: Any) -> None:
    use_registry(tmp_path, settings)
    source = write_candidate(tmp_path / "src")
    (source / "scripts" / "test.py").unlink()
    out = StringIO()
    with pytest.raises(CommandError, match="^candidate_refused: "):
        call_command("pack", "check", str(source), stdout=out)
    assert "required_missing" in out.getvalue() and "scripts/test.py" in out.getvalue()
    with pytest.raises(CommandError, match="^not_found: "):
        pack("publish", "abc")
    with pytest.raises(CommandError, match="^not_found: "):
        pack("switch", "nosuchpack", "on")
    with pytest.raises(CommandError, match="^invalid_request: "):
        pack("build", str(tmp_path / "empty"))


def test_a_refused_check_prints_why_each_case_failed(tmp_path: Path, settings: Any) -> None:
    use_registry(tmp_path, settings)
    expects_failure = CONTRACT.format(name="parcelcount").replace("status: succeeded", "status: failed")
    source = write_candidate(tmp_path / "src", contract=expects_failure)
    out = StringIO()
    with pytest.raises(CommandError, match=r"^candidate_refused: parcelcount did not pass the registry's checks \(contract_failed\)$"):
        call_command("pack", "check", str(source), stdout=out)
    printed = out.getvalue()
    failed = [line.strip() for line in printed.splitlines() if line.strip().startswith("case 'count': ")]
    assert len(failed) == 2  # the fake's run and the real one's
    assert all("failed" in line and "succeeded" in line for line in failed), printed  # expected vs got
