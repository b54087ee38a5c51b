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
from capabilities.manifest import load_pack
from tests.conftest import internal_client, pack_capability
from tests.process_support import publishing_to
from tests.test_workshop_template import SPEC
from workshop.models import WorkshopBuild
from yimi_project.call_capability import HEADER as CAP

PACK = Path(__file__).resolve().parent.parent / "packs" / "workshop"
URL = "/internal/workshop/"
INDEXES = Path(__file__).resolve().parent.parent / "workshop" / "indexes"


def report_text(report: Any) -> str:
    return "\n".join(f"{c.name}: {c.failures}" for c in report.cases) + "\n" + "\n".join(report.errors)


def test_the_manifest_declares_find_build_and_builds_off_by_default() -> None:
    pack = load_pack(PACK)
    assert {name: pack.tools[name].resolve_category({}) for name in pack.tools} == {
        "find": "observe", "build": "workspace", "builds": "observe"}
    assert (pack.platform_api, pack.enabled_by_default, pack.tools["build"].check_with) == (["workshop"], False, "builds")


def test_the_workshop_contract_passes_on_the_fake() -> None:
    report = run_contract(PACK, fake=True)
    assert report.passed, report_text(report)
    assert len(report.cases) == 5


@pytest.mark.django_db(transaction=True)
def test_the_real_server_passes_the_contract_against_the_platform(internal_listener: Any, owner: Any, settings: Any) -> None:
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
