"""Secrets are granted per pack (issue 35, item 3).

A pack that copies the ``personal`` pack's secret name (``CARDDAV_PASSWORD``) gets nothing:
dropped into the packs directory, its host starts without it and its calls answer
``secret_not_granted`` naming it; handed to the registry (``pack check``, the workshop,
``publish``), it is refused with that code. The personal pack still gets its secrets;
granting the other pack explicitly works, and revoking counts from the next host start.
"""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from capabilities.manifest import load_pack
from capabilities.mcp_host.manager import HostManager
from capabilities.mcp_host.sandbox import grant_for
from capabilities.mcp_host.secret_grants import NOT_GRANTED_ENV, PUBLISHED, SHIPPED, read_grants
from capabilities.registry import add_candidate, grants, online_digest, publish
from capabilities.registry_models import PackCandidate, SecretGrant
from tests.conftest import db_async, platform_paths
from tests.support.gateway_support import REPO_PACKS, copy_repo_pack, manifest, write_pack
from tests.support.registry_support import candidate_manifest, memo_honesty, write_candidate
from yimi_project.errors import YimiError

PASSWORD = "carddav-pw-0451"
COPYCAT_TOOLS = '''
import os
from capabilities.packkit import ToolRegistry, receipt

TOOLS = ToolRegistry()


@TOOLS("Peek at the address book password.", {"type": "object", "properties": {}})
def peek(args):
    return receipt("succeeded", content={"text": os.environ.get("CARDDAV_PASSWORD", "(none)")})
'''


def copycat_manifest() -> dict[str, Any]:
    """A pack that names the personal pack's secret as its own."""
    return manifest(
        "copycat", secrets=["CARDDAV_PASSWORD"], scopes=["owner"], tools={"peek": {"effect": "observe"}},
        runtime={"server": "copycat", "lazy": True, "idle_timeout_seconds": 900, "host": "dedicated"},
    )


@pytest.fixture
def platform(tmp_path: Path, settings: Any) -> dict[str, Path]:
    """A packs directory holding the real personal pack and a copycat dropped in beside it,
    the secrets directory holding the personal pack's secrets, and a registry (so its
    grants file) of the test's own; the shipped packs' grants as yimi_init makes them."""
    packs = tmp_path / "packs"
    packs.mkdir()
    copy_repo_pack(packs, "personal")
    write_pack(packs, "copycat", data=copycat_manifest(), tools_py=COPYCAT_TOOLS)
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    for name, value in (("CARDDAV_URL", "http://127.0.0.1:5232/owner/contacts/"), ("CARDDAV_USERNAME", "owner"), ("CARDDAV_PASSWORD", PASSWORD)):
        (secrets / name).write_text(value + "\n", encoding="utf-8")
    settings.YIMI_PACKS_DIR = packs
    settings.YIMI_PACK_REGISTRY_DIR = tmp_path / "registry"
    settings.SECRETS_DIR = secrets
    settings.YIMI_PACKS_ENABLE, settings.YIMI_PACKS_DISABLE = [], []
    grants.grant_shipped_secrets()
    return {"packs": packs, "secrets": secrets, "root": tmp_path}


def peek_result(result: Any) -> dict[str, Any]:
    assert not result.is_error and result.transport_error is None, result
    return result.structured


# --- dropped into the packs directory -------------------------------------------------------------


@pytest.mark.django_db
def test_the_personal_pack_gets_its_secrets_and_a_copycat_gets_nothing(platform: dict[str, Path]) -> None:
    paths = platform_paths(platform["root"], secrets_dir=platform["secrets"])
    personal = grant_for([load_pack(platform["packs"] / "personal")], paths)
    assert personal.env["CARDDAV_PASSWORD"] == PASSWORD and personal.env["CARDDAV_USERNAME"] == "owner"
    assert personal.withheld == {} and NOT_GRANTED_ENV not in personal.env

    copycat = grant_for([load_pack(platform["packs"] / "copycat")], paths)
    assert "CARDDAV_PASSWORD" not in copycat.env and PASSWORD not in json.dumps(copycat.env)
    assert copycat.withheld == {"copycat": ["CARDDAV_PASSWORD"]}
    assert json.loads(copycat.env[NOT_GRANTED_ENV]) == {"copycat": ["CARDDAV_PASSWORD"]}

    # nor does a secret it was not granted name a destination its egress proxy would let through
    write_pack(platform["packs"], "lookalike", data=manifest(
        "lookalike", secrets=["CARDDAV_URL"], network={"egress": [{"url_secret": "CARDDAV_URL", "why": "the address book"}]},
        scopes=["owner"], tools={"peek": {"effect": "observe"}},
        runtime={"server": "lookalike", "lazy": True, "idle_timeout_seconds": 900, "host": "dedicated"},
    ), tools_py=COPYCAT_TOOLS)
    lookalike = grant_for([load_pack(platform["packs"] / "lookalike")], paths)
    assert lookalike.egress == [] and lookalike.withheld == {"lookalike": ["CARDDAV_URL"]}
    assert personal.egress and {(r.host, r.port) for r in personal.egress} == {("127.0.0.1", 5232)}

    # what yimi_init granted: the shipped list, for the shipped personal pack only
    assert sorted(read_grants().granted) == sorted(
        (SHIPPED, "personal", s) for s in ("CARDDAV_URL", "CARDDAV_USERNAME", "CARDDAV_PASSWORD")
    )


@pytest.mark.django_db(transaction=True)
async def test_a_copycat_host_answers_secret_not_granted_until_granted_and_again_after_a_revocation(
    platform: dict[str, Path],
) -> None:
    paths = platform_paths(platform["root"], secrets_dir=platform["secrets"])

    manager = HostManager(platform["packs"], paths=paths)
    try:
        refused = peek_result(await manager.call("copycat__peek", {}))
        assert "CARDDAV_PASSWORD" not in manager.hosts["copycat"].params.env  # the host started without it
    finally:
        await manager.close()
    assert refused["status"] == "failed" and refused["error"]["code"] == "secret_not_granted"
    assert "CARDDAV_PASSWORD" in refused["error"]["message"] and PASSWORD not in json.dumps(refused)

    await db_async(grants.grant)("copycat", "CARDDAV_PASSWORD", by="test")  # the owner's explicit grant
    manager = HostManager(platform["packs"], paths=paths)
    try:
        granted = peek_result(await manager.call("copycat__peek", {}))
        assert granted["status"] == "succeeded" and granted["content"]["text"] == PASSWORD

        row = await db_async(grants.revoke)("copycat", "CARDDAV_PASSWORD", by="test")
        assert (row.origin, row.granted) == (SHIPPED, False)
        # the host running now was started with it and keeps it; the next start does not
        assert peek_result(await manager.call("copycat__peek", {}))["content"]["text"] == PASSWORD
        await manager.hosts["copycat"].stop()
        again = peek_result(await manager.call("copycat__peek", {}))
        assert again["status"] == "failed" and again["error"]["code"] == "secret_not_granted"
    finally:
        await manager.close()


@pytest.mark.django_db
def test_pack_status_names_the_secret_not_granted_and_the_command_grants_and_revokes(platform: dict[str, Path]) -> None:
    def pack(*args: str) -> str:
        out = StringIO()
        call_command("pack", *args, stdout=out)
        return out.getvalue()

    status = pack("status", "copycat")
    assert "secret CARDDAV_PASSWORD: secret_not_granted (manage.py pack grant copycat CARDDAV_PASSWORD) (shipped)" in status
    assert "secret CARDDAV_PASSWORD: granted (shipped)" in pack("status", "personal")

    assert "CARDDAV_PASSWORD: granted to the shipped pack copycat" in pack("grant", "copycat", "CARDDAV_PASSWORD")
    assert "secret CARDDAV_PASSWORD: granted (shipped)" in pack("status", "copycat")
    assert (SHIPPED, "copycat", "CARDDAV_PASSWORD") in read_grants().granted
    assert "revoked for the shipped pack copycat" in pack("revoke", "copycat", "CARDDAV_PASSWORD")
    assert (SHIPPED, "copycat", "CARDDAV_PASSWORD") not in read_grants().granted
    listed = pack("grants")
    assert any(line.split()[:4] == ["copycat", "shipped", "CARDDAV_PASSWORD", "revoked"] for line in listed.splitlines()), listed
    with pytest.raises(CommandError, match="^not_granted: "):
        pack("revoke", "copycat", "CARDDAV_PASSWORD")
    with pytest.raises(CommandError, match="^invalid_request: "):
        pack("grant", "copycat", "YIMI_INTERNAL_TOKEN")


# --- through the registry -------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_registry_refuses_a_candidate_declaring_a_secret_not_granted_to_it(platform: dict[str, Path]) -> None:
    source = write_candidate(platform["root"] / "src", manifest=candidate_manifest(secrets=["CARDDAV_PASSWORD"]))
    out = StringIO()
    with pytest.raises(CommandError, match=r"^candidate_refused: .*\(secret_not_granted\)$"):
        call_command("pack", "check", str(source), stdout=out)
    assert "secret_not_granted" in out.getvalue() and "CARDDAV_PASSWORD" in out.getvalue()
    refused = PackCandidate.objects.get()
    assert refused.state == PackCandidate.State.REFUSED and refused.honesty_report == {}  # refused before running anything
    assert [f["code"] for f in refused.static_report] == ["secret_not_granted"]

    # the shipped personal pack's grant is not one to a published pack of that name
    copied = write_candidate(platform["root"] / "named", "personal", manifest=candidate_manifest("personal", secrets=["CARDDAV_PASSWORD"]))
    named = add_candidate(copied, origin="operator", built_against=None, honesty=memo_honesty)
    assert [f["code"] for f in named.static_report] == ["secret_not_granted"]


@pytest.mark.django_db
def test_a_granted_candidate_passes_and_publish_refuses_it_once_the_grant_is_revoked(platform: dict[str, Path]) -> None:
    grants.grant("parcelcount", "CARDDAV_PASSWORD", by="test")  # before it is published: origin published
    assert SecretGrant.objects.get(pack_name="parcelcount").origin == PUBLISHED
    source = write_candidate(platform["root"] / "src", manifest=candidate_manifest(secrets=["CARDDAV_PASSWORD"]))
    passed = add_candidate(source, origin="workshop", built_against=None, honesty=memo_honesty)
    assert passed.state == PackCandidate.State.PASSED, (passed.static_report, passed.honesty_report)

    grants.revoke("parcelcount", "CARDDAV_PASSWORD", by="test")
    with pytest.raises(YimiError) as refused:
        publish(passed.digest)
    assert refused.value.code == "secret_not_granted" and "CARDDAV_PASSWORD" in refused.value.message
    assert online_digest("parcelcount") is None


@pytest.mark.django_db
def test_the_workshop_stops_a_build_whose_pack_declares_a_secret_not_granted(platform: dict[str, Path], settings: Any) -> None:
    from workshop.builds import build_candidate

    settings.YIMI_WORKSHOP_DIR = platform["root"] / "workshop"
    draft = write_candidate(platform["root"] / "draft", manifest=candidate_manifest(secrets=["CARDDAV_PASSWORD"]))
    with pytest.raises(YimiError) as stopped:
        build_candidate(draft)
    assert stopped.value.code == "secret_not_granted" and "CARDDAV_PASSWORD" in stopped.value.message
    assert not PackCandidate.objects.exists()  # nothing reached the registry


# --- install and the admin --------------------------------------------------------------------------


def test_the_shipped_list_is_what_the_shipped_packs_declare() -> None:
    """``SHIPPED_SECRETS`` is reviewed like code: a shipped pack's new secret is added to it."""
    declared = {}
    for path in sorted(REPO_PACKS.iterdir()):
        if (path / "plugin.json").is_file() and load_pack(path).secrets:
            declared[path.name] = tuple(load_pack(path).secrets)
    assert declared == grants.SHIPPED_SECRETS


@pytest.mark.django_db(transaction=True)  # yimi_init migrates, as test_init runs it
def test_yimi_init_grants_the_shipped_packs_and_never_grants_back_what_was_revoked(tmp_path: Path, settings: Any) -> None:
    settings.YIMI_PACK_REGISTRY_DIR = tmp_path / "registry"
    settings.YIMI_PACKS_DIR = REPO_PACKS
    call_command("yimi_init", "--no-pairing-code", stdout=StringIO())
    assert sorted(read_grants().granted) == sorted(grants.shipped_grant_rows())
    grants.revoke("personal", "CARDDAV_PASSWORD", by="the owner")
    out = StringIO()
    call_command("yimi_init", "--no-pairing-code", stdout=out)
    assert "pack secrets: 0 granted to shipped packs now" in out.getvalue()
    assert (SHIPPED, "personal", "CARDDAV_PASSWORD") not in read_grants().granted
    assert (SHIPPED, "personal", "CARDDAV_URL") in read_grants().granted


@pytest.mark.django_db
def test_the_owner_grants_and_revokes_in_the_admin_and_a_second_superuser_cannot(
    platform: dict[str, Path], owner: Any, django_user_model: Any
) -> None:
    client = Client()
    client.force_login(owner)
    response = client.post(
        "/admin/capabilities/secretgrant/add/", {"pack_name": "copycat", "origin": "shipped", "secret": "CARDDAV_PASSWORD"}, follow=True
    )
    assert response.status_code == 200
    row = SecretGrant.objects.get(pack_name="copycat")
    assert row.granted and row.granted_by == "admin: owner"
    assert (SHIPPED, "copycat", "CARDDAV_PASSWORD") in read_grants().granted

    bad = client.post("/admin/capabilities/secretgrant/add/", {"pack_name": "copycat", "origin": "shipped", "secret": "YIMI_INTERNAL_TOKEN"})
    assert bad.status_code == 200 and "invalid_request" in bad.content.decode()  # the form again, with the reason

    response = client.post("/admin/capabilities/secretgrant/", {"action": "revoke_selected", "_selected_action": [row.pk]}, follow=True)
    assert any("revoked" in str(m) for m in response.context["messages"])
    assert (SHIPPED, "copycat", "CARDDAV_PASSWORD") not in read_grants().granted
    assert client.get(f"/admin/capabilities/secretgrant/{row.pk}/delete/").status_code == 403

    second = django_user_model.objects.create_superuser("second-admin", password="pw-pw-pw-pw")
    other = Client()
    other.force_login(second)
    assert other.get("/admin/capabilities/secretgrant/").status_code == 403
    assert other.post(
        "/admin/capabilities/secretgrant/add/", {"pack_name": "copycat", "origin": "shipped", "secret": "CARDDAV_PASSWORD"}
    ).status_code == 403
    assert SecretGrant.objects.get(pack_name="copycat").granted is False
