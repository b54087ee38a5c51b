"""How the owner asks through Yimi: the release pack's ``rollback`` tool (``self_change``)
through the gateway and the release authority's gate, its internal endpoint, and its
contract on the real server against the platform and on the fake."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from brain.models import Run
from brain.services import accept_utterance
from capabilities.contract import run_contract
from capabilities.manifest import load_pack
from capabilities.mcp_host.host import load_tools_module
from capabilities.services import CallRequest, decide
from releases.request_models import RollbackRequest
from tests.conftest import internal_client, new_client_id, pack_capability
from tests.support.gateway_support import copy_repo_pack
from yimi_project import call_capability

PACK = Path(__file__).resolve().parents[2] / "packs" / "release"


def test_the_manifest_declares_a_self_change_tool_off_by_default() -> None:
    pack = load_pack(PACK)
    assert pack.platform_api == ["releases"] and pack.scopes == ["owner"] and not pack.enabled_by_default
    rollback = pack.tools["rollback"]
    assert (rollback.resolve_category({}), rollback.retry, rollback.check_with) == ("self_change", "after_check", "rollback_status")
    assert pack.tools["rollback_status"].resolve_category({}) == "observe"
    for fake in (False, True):
        assert set(load_tools_module(pack, fake).tools) == set(pack.tools)


def test_the_fake_contract_passes() -> None:
    report = run_contract(PACK, fake=True)
    assert report.passed, [(c.name, c.failures) for c in report.cases]
    assert len(report.cases) == 3


@pytest.mark.django_db(transaction=True)
def test_the_real_contract_passes_against_the_platform(internal_listener: Any, owner: Any) -> None:
    report = run_contract(PACK, fake=False, owner_id=owner.pk)
    assert report.passed, [(c.name, c.failures) for c in report.cases]
    assert [c.name for c in report.cases] == ["a rollback needs the owner's words", "a status of a request that does not exist is not found"]
    assert not RollbackRequest.objects.exists()


@pytest.fixture
def release_run(make_device: Any, tmp_path: Path, settings: Any) -> Run:
    packs = tmp_path / "packs"
    packs.mkdir()
    copy_repo_pack(packs, "release")
    settings.YIMI_PACKS_DIR = packs
    settings.YIMI_PACKS_ENABLE = ["release"]
    accepted = accept_utterance(make_device().device, new_client_id(), "不要这个版本了，改回去")
    return Run.objects.get(id=accepted.run_id)


@pytest.mark.django_db
def test_the_gateway_allows_the_rollback_only_when_the_owner_asked(release_run: Run) -> None:
    asked = decide(CallRequest(str(release_run.id), "release__rollback", {"reason": "不要这个版本了", "owner_requested": True}))
    assert (asked.decision, asked.code) == ("rewrite", "owner_requested")  # allowed; owner_requested is stripped
    claims = call_capability.verify(call_capability.PACK, asked.pack_capability)
    assert claims["category"] == "self_change" and claims["apis"] == ["releases"]
    on_its_own = decide(CallRequest(str(release_run.id), "release__rollback", {"reason": "I think so"}))
    assert (on_its_own.decision, on_its_own.code) == ("block", "owner_request_required")


@pytest.mark.django_db
def test_a_guest_cannot_ask(make_device: Any, tmp_path: Path, settings: Any) -> None:
    packs = tmp_path / "packs"
    packs.mkdir()
    copy_repo_pack(packs, "release")
    settings.YIMI_PACKS_DIR = packs
    settings.YIMI_PACKS_ENABLE = ["release"]
    accepted = accept_utterance(make_device(guest=True).device, new_client_id(), "roll it back")
    decision = decide(CallRequest(str(accepted.run_id), "release__rollback", {"reason": "x", "owner_requested": True}))
    assert decision.decision == "block"


@pytest.mark.django_db
def test_the_endpoint_queues_only_for_the_rollback_call(owner: Any, tmp_path: Path, settings: Any) -> None:
    settings.YIMI_RELEASES_ROOT = str(tmp_path / "releases")
    observe = pack_capability(owner.pk, pack="release", category="observe", apis=["releases"], tool="release__rollback_status")
    refused = internal_client(**{call_capability.HEADER: observe}).post(
        "/internal/releases/rollback/", json.dumps({"reason": "改回去"}), content_type="application/json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert not RollbackRequest.objects.exists()
    capability = pack_capability(owner.pk, pack="release", category="self_change", apis=["releases"], tool="release__rollback")
    client = internal_client(**{call_capability.HEADER: capability})
    made = client.post("/internal/releases/rollback/", json.dumps({"reason": "改回去"}), content_type="application/json")
    assert made.status_code == 200 and made.json()["state"] == "pending"
    assert RollbackRequest.objects.get().reason == "改回去"
    status = client.post("/internal/releases/status/", json.dumps({}), content_type="application/json")
    assert status.json()["request_id"] == made.json()["request_id"]
