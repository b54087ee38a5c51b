"""F4 end to end (issue 18): a build Yimi started goes live without a go-live confirmation
once the registry's checks pass, its tool is callable through the gateway without a
restart, the agent's ``workshop__builds`` says it is live (version, digest), and
``workshop__pack_revert`` takes it back when the owner asks; a build whose pack went online
in another version meanwhile ends ``online_version_changed`` and publishes nothing.

Everything is real: the workshop sandbox, the registry's static and honesty checks, the
pack hosts in the bubblewrap sandbox, the gateway over the internal socket."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from brain.services import accept_utterance
from capabilities.mcp_host import runtime
from capabilities.registry import add_candidate, online_digest, publish
from capabilities.registry.monitor import monitor_cycle
from capabilities.registry_models import PackVersion
from tests.conftest import need, new_client_id
from tests.support.gateway_support import copy_repo_pack
from tests.support.registry_support import memo_honesty, use_registry
from tests.workshop.test_workshop_sandbox import usable
from tests.workshop.test_workshop_template import SPEC
from workshop.builds import execute_build, published_version
from workshop.drafts import fill_template
from workshop.models import WorkshopBuild


@pytest.fixture
def platform(settings: Any, tmp_path: Path) -> Any:
    """A platform shipping ``demo`` and the workshop pack (on), a registry and a workshop of
    its own, and the pack runtime of this process (as the web server and workers run it)."""
    need(usable(), "the workshop sandbox (bubblewrap, writable cgroups) is needed")
    shipped = use_registry(tmp_path, settings)
    copy_repo_pack(shipped, "workshop")
    settings.YIMI_PACKS_ENABLE = ["workshop"]
    settings.YIMI_WORKSHOP_DIR = tmp_path / "workshop"
    settings.YIMI_PACKS_FAKE = False
    runtime.reset_for_tests()
    yield shipped
    runtime.reset_for_tests()


def call(run_id: str, tool: str, args: dict[str, Any]) -> Any:
    from capabilities.client import call_tool

    return asyncio.run(call_tool(run_id, "", tool, args))


@pytest.mark.django_db(transaction=True)
def test_a_yimi_build_goes_live_is_callable_without_a_restart_and_is_reverted_on_request(
    platform: Path, internal_listener: Any, make_device: Any
) -> None:
    phone = make_device("phone")
    run_id = str(accept_utterance(phone.device, new_client_id(), "10 公里是多少英里").run_id)
    before = call(run_id, "units__to_miles", {"km": 10})
    assert (before.executed, before.code) == (False, "unknown_tool")

    said: list[str] = []
    build = execute_build(WorkshopBuild.objects.create(spec=SPEC).id, progress=said.append)
    assert (build.state, build.error_code, build.candidate_state) == ("succeeded", "", "passed"), (build.error_message, build.log_tail)
    assert online_digest("units") == build.candidate_digest  # live, with no confirmation asked
    assert published_version(build) == {"name": "units", "version": "0.1.0", "digest": build.candidate_digest, "state": "active", "online": True}
    assert f"publishing units 0.1.0 ({build.candidate_digest[:12]})" in said and "units 0.1.0 (" + build.candidate_digest[:12] + ") is online" in said

    # the new tool, through the gateway, in the same process: no restart
    used = call(run_id, "units__to_miles", {"km": 10})
    assert (used.decision, used.executed) == ("allow", True), used.model_text
    assert used.receipt["status"] == "succeeded" and used.receipt["values"][0]["value"] == 6.214
    # what the agent reads about its build
    told = call(run_id, "workshop__builds", {"build_id": str(build.id)})
    assert told.receipt["summary"] == f"build {build.id} of units: units 0.1.0 ({build.candidate_digest[:12]}) is live", told.model_text
    assert told.receipt["content"]["items"][0]["published"]["digest"] == build.candidate_digest
    # monitoring covers it: a Yimi-built version online
    [watched] = monitor_cycle()
    assert (watched["pack"], watched["digest"], watched["health"], watched["action"]) == ("units", build.candidate_digest, "ok", "stay")

    # asked for by no one, the owner_data gate cards it and nothing is reverted
    unasked = call(run_id, "workshop__pack_revert", {"name": "units", "digest": build.candidate_digest})
    assert (unasked.decision, unasked.executed) == ("ask", False), unasked.model_text
    assert online_digest("units") == build.candidate_digest
    # "I don't want this version": the owner asked, so the owner_data gate lets it through
    reverted = call(run_id, "workshop__pack_revert", {"name": "units", "owner_requested": True})
    # let through, not carded; "rewrite" because the gateway strips owner_requested (tests/capabilities/test_gateway.py)
    assert (reverted.decision, reverted.executed) == ("rewrite", True), reverted.model_text
    assert reverted.receipt["status"] == "succeeded", reverted.model_text
    assert reverted.receipt["summary"] == f"units: 0.1.0 ({build.candidate_digest[:12]}) taken back; no version is online now, the pack is removed"
    assert online_digest("units") is None
    assert call(run_id, "units__to_miles", {"km": 10}).code == "unknown_tool"
    again = call(run_id, "workshop__builds", {"build_id": str(build.id)})
    assert again.receipt["summary"].endswith("was live, now reverted")
    shipped = call(run_id, "workshop__pack_revert", {"name": "demo", "owner_requested": True})
    assert shipped.receipt["status"] == "failed" and shipped.receipt["error"]["code"] == "not_yimi_built"


@pytest.mark.django_db
def test_a_build_whose_pack_went_online_meanwhile_ends_without_publishing(platform: Path, tmp_path: Path) -> None:
    """The build starts with nothing online (built against none); while it self-tests,
    another version of the same pack is published. Its candidate passes the checks, but
    publishing compares the online version with the one it was built against."""
    other = fill_template({**SPEC, "version": "0.0.9"}, tmp_path / "other")
    published: list[str] = []

    def meanwhile(line: str) -> None:
        if line == "attempt 1: self-test in the sandbox":
            made = add_candidate(other, origin="workshop", built_against=None, honesty=memo_honesty)
            published.append(publish(made.digest).digest)

    build = execute_build(WorkshopBuild.objects.create(spec=SPEC).id, progress=meanwhile)
    assert (build.state, build.error_code, build.candidate_state) == ("failed", "online_version_changed", "passed"), build.error_message
    assert build.error_message.startswith("not published: the online version changed")
    assert build.candidate_digest and build.candidate_digest != published[0]
    assert online_digest("units") == published[0]
    assert published_version(build) is None
    assert list(PackVersion.objects.filter(pack__name="units").values_list("digest", flat=True)) == published
