"""``pack_contract`` never writes into the live owner's memory or schedule unless told to:
the real contracts of packs with a ``platform_api`` run only with ``--against-live``."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command

from capabilities.management.commands.pack_contract import acts_on_live_owner
from memory.models import Assertion


def test_platform_backed_packs_are_the_ones_acting_on_the_live_owner() -> None:
    packs = settings.YIMI_PACKS_DIR
    assert acts_on_live_owner(packs / "memory")
    assert acts_on_live_owner(packs / "schedule")
    assert not acts_on_live_owner(packs / "workspace")


@pytest.mark.django_db
def test_real_memory_and_schedule_contracts_are_held_back_without_against_live(owner: Any) -> None:
    out = io.StringIO()
    call_command("pack_contract", "memory", "schedule", stdout=out)
    text = out.getvalue()
    rows = [line.split() for line in text.splitlines()]
    assert rows[1][:3] == ["memory", "real", "skip"]
    assert rows[2][:3] == ["schedule", "real", "skip"]
    assert "--against-live" in text
    assert "0/0 contract runs passed" in text
    assert not Assertion.objects.filter(owner=owner).exists()
