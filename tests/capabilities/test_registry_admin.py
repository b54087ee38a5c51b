"""The pack registry in the admin (issue 18): a pack reviewer (staff, not the owner) sees
packs with their manifest, versions and switch, and candidates with their check results;
actions turn a pack off or revert its online version, through the registry's services."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from capabilities.manifest import load_packs
from capabilities.registry import add_candidate
from capabilities.registry.publish import record_shipped_versions
from capabilities.registry_models import PackCandidate, RegisteredPack
from tests.support.registry_support import use_registry, write_candidate

pytestmark = pytest.mark.django_db


def test_a_pack_reviewer_sees_packs_and_check_results_and_can_turn_a_pack_off(
    tmp_path: Path, settings: Any, django_user_model: Any
) -> None:
    use_registry(tmp_path, settings)
    record_shipped_versions()
    source = write_candidate(tmp_path / "src")
    (source / "server" / "keys.py").write_text('password = "hunter2hunter2hunter2"\n')
    refused = add_candidate(source, origin="workshop", built_against=None)
    reviewer = django_user_model.objects.create_superuser("reviewer", password="pw-pw-pw-pw")
    client = Client()
    client.force_login(reviewer)

    listing = client.get("/admin/capabilities/registeredpack/").content.decode()
    assert "demo" in listing and "shipped" in listing
    demo = RegisteredPack.objects.get(name="demo")
    page = client.get(f"/admin/capabilities/registeredpack/{demo.pk}/change/").content.decode()
    assert "ai.yimi.capability" in page and "1.0.0" in page and "active" in page

    candidate_page = client.get(f"/admin/capabilities/packcandidate/{refused.pk}/change/").content.decode()
    assert refused.state == PackCandidate.State.REFUSED
    assert "secret_value" in candidate_page and "server/keys.py" in candidate_page
    assert "hunter2hunter2" not in candidate_page

    response = client.post(
        "/admin/capabilities/registeredpack/", {"action": "turn_off", "_selected_action": [demo.pk]}, follow=True
    )
    assert [str(m) for m in response.context["messages"]] == ["demo: turned off"]
    assert load_packs().disabled["demo"] == "turned off in the pack registry"
    response = client.post(
        "/admin/capabilities/registeredpack/", {"action": "revert_online_version", "_selected_action": [demo.pk]}, follow=True
    )
    assert [str(m) for m in response.context["messages"]] == ["demo: nothing_to_revert: no published version of 'demo' is online"]
    assert client.get(f"/admin/capabilities/registeredpack/{demo.pk}/delete/").status_code == 403
