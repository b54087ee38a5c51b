"""Publishing through the registry (issue 18, flow F4): compare-and-swap on the
online version, preload, activation without a restart (and its undo), revert to the previous
version or removal of a first one, and the enable switches' precedence.

Candidates go through the real static and honesty checks (the honesty check once per
digest in a session: ``memo_honesty``); hosts start for real in the bubblewrap sandbox."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from capabilities.manifest import load_packs, selection_file
from capabilities.mcp_host import runtime
from capabilities.registry import add_candidate, online_digest, publish, revert, set_enabled
from capabilities.registry.publish import record_shipped_versions
from capabilities.registry_models import PackCandidate, PackVersion, RegisteredPack
from tests.support.gateway_support import manifest, write_pack
from tests.support.registry_support import candidate, memo_honesty, use_registry, write_candidate
from yimi_project.errors import YimiError

pytestmark = pytest.mark.django_db


@pytest.fixture
def shipped(tmp_path: Path, settings: Any) -> Path:
    return use_registry(tmp_path, settings)

def test_a_published_pack_is_served_next_to_the_shipped_ones_and_reverting_a_first_version_removes_it(
    shipped: Path, tmp_path: Path
) -> None:
    v1 = candidate(tmp_path, 1, None)
    lines: list[str] = []
    version = publish(v1.digest, progress=lines.append)
    packs = load_packs()
    assert sorted(packs.packs) == ["demo", "parcelcount"]
    assert packs.packs["parcelcount"].digest == v1.digest and packs.packs["demo"].digest == ""
    assert packs.packs["parcelcount"].path == Path(v1.path)
    assert online_digest("parcelcount") == v1.digest
    assert version.state == PackVersion.State.ACTIVE and version.previous is None
    assert json.loads(selection_file().read_text())["published"]["parcelcount"]["digest"] == v1.digest
    assert any(line.startswith("preloaded: 1 tool") for line in lines)

    assert revert("parcelcount", reason="I don't want this version") is None
    assert sorted(load_packs().packs) == ["demo"]
    assert online_digest("parcelcount") is None
    version.refresh_from_db()
    assert version.state == PackVersion.State.REVERTED and version.end_reason == "I don't want this version"
    with pytest.raises(YimiError) as again:
        revert("parcelcount", reason="again")
    assert again.value.code == "nothing_to_revert"


def test_publishing_refuses_when_the_online_version_changed_since_the_build(shipped: Path, tmp_path: Path) -> None:
    """Two builds of a new pack started while nothing was online; the first one published,
    so the second was built against a version that is no longer the online one."""
    v1 = candidate(tmp_path, 1, None)
    v2 = candidate(tmp_path, 2, None)
    publish(v1.digest)
    with pytest.raises(YimiError) as raced:
        publish(v2.digest)
    assert raced.value.code == "online_version_changed"
    assert online_digest("parcelcount") == v1.digest
    assert PackVersion.objects.filter(pack__name="parcelcount").count() == 1
    with pytest.raises(YimiError) as same:
        publish(v1.digest)
    assert same.value.code == "already_online"


def test_a_refused_candidate_a_shipped_name_or_a_changed_copy_is_not_published(shipped: Path, tmp_path: Path) -> None:
    bad = write_candidate(tmp_path / "bad", name="badpack")
    (bad / "mcp.json").unlink()
    refused = add_candidate(bad, origin="workshop", built_against=None, honesty=memo_honesty)
    good = candidate(tmp_path, 1, None)
    write_pack(shipped, "parcelcount")
    codes = []
    for digest in (refused.digest, good.digest, "0" * 64):
        with pytest.raises(YimiError) as error:
            publish(digest)
        codes.append(error.value.code)
    (shipped / "parcelcount" / "plugin.json").unlink()
    (shipped / "parcelcount").rename(tmp_path / "gone")
    (Path(good.path) / "SKILL.md").write_text("# changed after the checks\n")
    with pytest.raises(YimiError) as changed:
        publish(good.digest)
    assert codes == ["candidate_refused", "shipped_pack_name", "not_found"]
    assert changed.value.code == "candidate_changed"
    assert not PackVersion.objects.exists()


def test_an_activation_failure_restores_the_previous_selection(shipped: Path, tmp_path: Path) -> None:
    """Version 2 preloads; then, as it is activated, its copy in the registry is damaged
    (the test does it from the progress callback, the moment the switch is made): the
    loader refuses it, so the switch is undone and version 1 stays online."""
    v1 = candidate(tmp_path, 1, None)
    v2 = candidate(tmp_path, 2, None)
    publish(v1.digest)
    PackCandidate.objects.filter(pk=v2.pk).update(built_against=v1.digest)

    def damage(line: str) -> None:
        if line.startswith("activating"):
            (Path(v2.path) / "plugin.json").unlink()

    with pytest.raises(YimiError) as failed:
        publish(v2.digest, progress=damage)
    assert failed.value.code == "activation_failed"
    assert "the previous selection is restored" in failed.value.message
    assert online_digest("parcelcount") == v1.digest
    assert load_packs().packs["parcelcount"].digest == v1.digest
    assert json.loads(selection_file().read_text())["published"]["parcelcount"]["digest"] == v1.digest
    states = dict(PackVersion.objects.filter(pack__name="parcelcount").values_list("digest", "state"))
    assert states == {v1.digest: "active", v2.digest: "reverted"}


def test_the_running_hosts_switch_versions_without_a_restart_and_announce_it(shipped: Path, tmp_path: Path, settings: Any) -> None:
    """This process runs pack hosts (the runtime, as the web server and workers do).
    Publishing version 2 replaces the running host of version 1 and bumps the tool-list
    version (what a host's tools/list_changed does); reverting brings version 1 back."""
    settings.YIMI_PACKS_FAKE = False
    runtime.reset_for_tests()

    def listed() -> tuple[list[str], int]:
        async def work(manager: Any) -> tuple[list[str], int]:
            tools = await manager.list_tools(["parcelcount", "demo"])
            return sorted(tools), manager.tools_version

        return asyncio.run(runtime.on_host_loop(work))

    try:
        v1 = candidate(tmp_path, 1, None)
        publish(v1.digest)
        tools, version_after_v1 = listed()
        assert "parcelcount__count" in tools and "parcelcount__arrived" not in tools
        v2 = candidate(tmp_path, 2, v1.digest)
        publish(v2.digest)
        tools, version_after_v2 = listed()
        assert {"parcelcount__count", "parcelcount__arrived", "demo__read"} <= set(tools)
        assert version_after_v2 > version_after_v1
        assert revert("parcelcount", reason="monitoring said so").digest == v1.digest
        tools, version_after_revert = listed()
        assert "parcelcount__arrived" not in tools and "parcelcount__count" in tools
        assert version_after_revert > version_after_v2
    finally:
        runtime.reset_for_tests()


def test_switch_precedence_and_the_shipped_version_history(shipped: Path, settings: Any) -> None:
    """YIMI_PACKS_DISABLE > the registry's switch > YIMI_PACKS_ENABLE > enabled_by_default."""
    write_pack(shipped, "homepack", manifest("homepack", enabled_by_default=False))
    assert "homepack" in load_packs().disabled
    set_enabled("homepack", True)
    assert "homepack" in load_packs().packs
    set_enabled("demo", False)
    assert load_packs().disabled["demo"] == "turned off in the pack registry"
    settings.YIMI_PACKS_ENABLE = ["demo"]
    assert "demo" in load_packs().disabled  # the registry's off beats the deployer's enable
    settings.YIMI_PACKS_DISABLE = ["homepack"]
    assert load_packs().disabled["homepack"] == "turned off by YIMI_PACKS_DISABLE"
    set_enabled("demo", None)
    assert "demo" in load_packs().packs
    with pytest.raises(YimiError) as unknown:
        set_enabled("nosuchpack", False)
    assert unknown.value.code == "not_found"

    first = record_shipped_versions()
    assert sorted(v.pack.name for v in first) == ["demo", "homepack"]
    assert record_shipped_versions() == []
    data = manifest("demo")
    data["version"] = "1.1.0"
    (shipped / "demo" / "plugin.json").write_text(json.dumps(data))
    (second,) = record_shipped_versions()
    history = list(RegisteredPack.objects.get(name="demo").versions.order_by("activated_at").values_list("version", "state"))
    assert history == [("1.0.0", "superseded"), ("1.1.0", "active")]
    assert second.previous is not None and second.previous.version == "1.0.0"
