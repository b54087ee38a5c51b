"""The ``workshop`` pack: capability_find and starting a build, reached by the agent through
the gateway like every tool (``/internal/workshop/``, platform API ``workshop``), over the
contract (fake, and the real server against the test's platform)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings

from capabilities.contract import run_contract
from capabilities.manifest import load_pack, load_packs
from capabilities.registry_models import PackVersion
from tests.conftest import internal_client, need, pack_capability
from tests.support.process_support import publishing_to
from tests.workshop.test_workshop_template import SPEC
from workshop.models import WorkshopBuild
from yimi_project.call_capability import HEADER as CAP

PACK = Path(__file__).resolve().parents[2] / "packs" / "workshop"
URL = "/internal/workshop/"
INDEXES = Path(__file__).resolve().parents[2] / "workshop" / "indexes"


def report_text(report: Any) -> str:
    return "\n".join(f"{c.name}: {c.failures}" for c in report.cases) + "\n" + "\n".join(report.errors)


def test_the_manifest_declares_find_build_builds_and_pack_revert_off_by_default() -> None:
    pack = load_pack(PACK)
    assert {name: pack.tools[name].resolve_category({}) for name in pack.tools} == {
        "find": "observe", "build": "workspace", "builds": "observe", "pack_revert": "owner_data"}
    assert (pack.platform_api, pack.enabled_by_default, pack.tools["build"].check_with) == (["workshop"], False, "builds")
    assert pack.tools["pack_revert"].check_with == "builds"


def test_the_workshop_contract_passes_on_the_fake() -> None:
    report = run_contract(PACK, fake=True)
    assert report.passed, report_text(report)
    assert len(report.cases) == 7


@pytest.mark.django_db(transaction=True)
def test_the_real_server_passes_the_contract_against_the_platform(internal_listener: Any, owner: Any, settings: Any) -> None:
    need(bool(django_settings.REDIS_URL), "the build is published to Celery's Redis broker (set REDIS_URL)")
    settings.YIMI_WORKSHOP_SKILL_INDEX = INDEXES / "skills.example.json"
    prefix = f"yimi-test-workshop-{uuid.uuid4().hex[:8]}"  # a queue no worker consumes: the build stays queued
    broker = redis.Redis.from_url(django_settings.REDIS_URL)
    try:
        with publishing_to(prefix, settings):
            report = run_contract(PACK, fake=False, owner_id=owner.pk)
        assert report.passed, report_text(report)
        build = WorkshopBuild.objects.get()
        assert (build.spec["name"], build.state) == ("contract-hello", "queued")
        [message] = broker.lrange(f"{prefix}:{prefix}-tasks", 0, -1)  # the build's Celery task, published once
        assert json.loads(message)["headers"]["task"] == "workshop.tasks.run_build" and str(build.id) in message.decode()
    finally:
        for key in broker.scan_iter(f"{prefix}:*"):
            broker.delete(key)


def internal(owner: Any, category: str, tool: str, apis: tuple[str, ...] = ("workshop",)) -> Any:
    return internal_client(**{CAP: pack_capability(owner.pk, pack="workshop", category=category, apis=list(apis), tool=tool)})


@pytest.mark.django_db
def test_a_build_starts_only_for_a_workshop_build_call_decided_as_workspace(owner: Any, settings: Any) -> None:
    body = {"action": "build", "spec": SPEC}
    for refused in (internal(owner, "observe", "workshop__build"), internal(owner, "workspace", "workshop__find"),
                    internal(owner, "workspace", "workshop__build", apis=("watches",)), internal_client()):
        answer = refused.post(URL, body, content_type="application/json")
        assert (answer.status_code, answer.json()["error"]["code"]) == (403, "forbidden")
    bad = internal(owner, "workspace", "workshop__build").post(URL, {**body, "spec": {**SPEC, "adapter": ""}}, content_type="application/json")
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_spec")
    assert not WorkshopBuild.objects.exists()
    made = internal(owner, "workspace", "workshop__build").post(URL, body, content_type="application/json").json()["build"]
    build = WorkshopBuild.objects.get()
    assert (made["id"], made["name"], made["state"]) == (str(build.id), "units", "queued")
    listed = internal(owner, "observe", "workshop__builds").post(URL, {"action": "builds"}, content_type="application/json").json()
    assert [b["id"] for b in listed["builds"]] == [made["id"]]


@pytest.mark.django_db
def test_find_through_the_endpoint_reports_its_sources(owner: Any, settings: Any, tmp_path: Path) -> None:
    settings.YIMI_WORKSHOP_SKILL_INDEX = INDEXES / "skills.example.json"
    settings.YIMI_WORKSHOP_MCP_INDEX = tmp_path / "missing.json"
    found = internal(owner, "observe", "workshop__find").post(URL, {"action": "find", "query": "convert miles"},
                                                              content_type="application/json").json()
    assert found["results"][0]["id"] == "unit-converter"
    assert [(s["name"], s["status"]) for s in found["sources"]] == [("packs", "ok"), ("skills", "ok"), ("mcp", "unavailable")]


def revert_client(owner: Any, name: str, *, category: str = "owner_data", tool: str = "workshop__pack_revert") -> Any:
    """The internal client of a ``workshop__pack_revert`` call the gateway decided on ``name``."""
    return internal_client(**{CAP: pack_capability(owner.pk, pack="workshop", category=category, apis=["workshop"], tool=tool, name=name)})


def revert_answer(client: Any, **body: Any) -> Any:
    return client.post(URL, {"action": "revert", **body}, content_type="application/json")


@pytest.mark.django_db
def test_pack_revert_takes_a_yimi_built_pack_back_and_says_which_version_is_online(owner: Any, settings: Any, tmp_path: Path) -> None:
    """The owner asks for the previous version ("用回之前那版"): version 2 → version 1, then the first version is removed;
    the answer names the version online, read back from the registry."""
    from capabilities.registry import online_digest, publish
    from tests.support.registry_support import candidate, use_registry

    use_registry(tmp_path, settings)
    v1 = candidate(tmp_path, 1, None)
    publish(v1.digest)
    v2 = candidate(tmp_path, 2, v1.digest)
    publish(v2.digest)
    client = revert_client(owner, "parcelcount")
    for refused, code in (
        (revert_client(owner, "parcelcount", category="workspace"), "forbidden"),  # decided as another category
        (revert_client(owner, "parcelcount", tool="workshop__build"), "forbidden"),
        (revert_client(owner, "otherpack"), "forbidden"),  # the call was decided on another pack
    ):
        answer = revert_answer(refused, name="parcelcount")
        assert (answer.status_code, answer.json()["error"]["code"]) == (403, code)
    stale = revert_answer(client, name="parcelcount", digest=v1.digest)  # the owner looked at v1: v2 is online
    assert (stale.status_code, stale.json()["error"]["code"]) == (400, "online_version_changed")
    assert online_digest("parcelcount") == v2.digest

    back = revert_answer(client, name="parcelcount", digest=v2.digest).json()["revert"]
    assert back == {"pack": "parcelcount", "reverted": {"version": "2.0.0", "digest": v2.digest},
                    "online": {"version": "1.0.0", "digest": v1.digest}, "removed": False}
    assert online_digest("parcelcount") == v1.digest
    assert PackVersion.objects.get(digest=v2.digest).end_reason == "the owner asked for the previous version"
    gone = revert_answer(client, name="parcelcount").json()["revert"]
    assert gone == {"pack": "parcelcount", "reverted": {"version": "1.0.0", "digest": v1.digest}, "online": None, "removed": True}
    assert online_digest("parcelcount") is None and "parcelcount" not in load_packs().packs
    nothing = revert_answer(client, name="parcelcount")
    assert (nothing.status_code, nothing.json()["error"]["code"]) == (400, "nothing_to_revert")


@pytest.mark.django_db
def test_pack_revert_refuses_a_shipped_pack_and_an_operators_pack(owner: Any, settings: Any, tmp_path: Path) -> None:
    from capabilities.registry import add_candidate, online_digest, publish
    from tests.support.registry_support import candidate_manifest, memo_honesty, use_registry, write_candidate

    use_registry(tmp_path, settings)  # ships "demo"
    shipped = revert_answer(revert_client(owner, "demo"), name="demo")
    assert (shipped.status_code, shipped.json()["error"]["code"]) == (400, "not_yimi_built")
    assert "shipped pack" in shipped.json()["error"]["message"]
    data = candidate_manifest("opspack", maintainer="lead", provenance={"source": "operator", "build": "test", "adapters": ["server/tools.py"]})
    made = add_candidate(write_candidate(tmp_path, "opspack", manifest=data), origin="operator", built_against=None, honesty=memo_honesty)
    assert made.state == "passed", (made.static_report, made.honesty_report)
    publish(made.digest)
    operators = revert_answer(revert_client(owner, "opspack"), name="opspack")
    assert (operators.status_code, operators.json()["error"]["code"]) == (400, "not_yimi_built")
    assert online_digest("opspack") == made.digest  # nothing changed
    bad = revert_answer(revert_client(owner, "opspack"), name="opspack", digest="abc")
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_request")


def test_the_fake_reverts_its_yimi_built_pack_with_the_real_servers_receipt() -> None:
    """The fake's one Yimi-built pack, through the server's tool code: the receipt names the
    version online after the revert, then says the pack is removed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("workshop_fake_for_test", PACK / "fake" / "tools.py")
    assert spec is not None and spec.loader is not None
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    first = fake.server.pack_revert({"name": "parcel-notes"})
    assert first["status"] == "succeeded" and first["next"]["retry"] == "forbidden"
    assert first["summary"] == f"parcel-notes: 1.1.0 ({'2' * 12}) taken back; 1.0.0 ({'1' * 12}) is online now"
    assert [(e["target"], e["action"], e["verification"]) for e in first["effects"]] == [("pack:parcel-notes", "revert", "verified")]
    second = fake.server.pack_revert({"name": "parcel-notes"})
    assert second["summary"] == f"parcel-notes: 1.0.0 ({'1' * 12}) taken back; no version is online now, the pack is removed"
    assert fake.server.pack_revert({"name": "parcel-notes"})["error"]["code"] == "nothing_to_revert"
