"""The personal pack against a real CardDAV server (Radicale in a child process): contacts
created over CardDAV are listed, found and resolved; "send Alice a note" resolves Alice
to her address and the messaging pack writes it to its local outbox for that address; a name two contacts share is
ambiguous and asks, never guesses; the profile comes from memory's USER.md."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from capabilities.contract import run_contract
from capabilities.egress import Rule
from capabilities.manifest import load_pack
from capabilities.mcp_host.sandbox import grant_for
from tests.conftest import platform_paths
from tests.schedules.test_watches import report_text
from tests.support.carddav_server import PASSWORD, USER, RadicaleServer

PACKS = Path(__file__).resolve().parents[2] / "packs"
ALICE = "BEGIN:VCARD\r\nVERSION:3.0\r\nUID:alice-1\r\nFN:Alice Wang\r\nN:Wang;Alice;;;\r\nEMAIL;TYPE=INTERNET:alice@example.com\r\nEND:VCARD\r\n"
ALICE_CHEN = "BEGIN:VCARD\r\nVERSION:3.0\r\nUID:alice-2\r\nFN:Alice Chen\r\nN:Chen;Alice;;;\r\nEMAIL:achen@example.com\r\nEND:VCARD\r\n"
LIN = "BEGIN:VCARD\r\nVERSION:3.0\r\nUID:lin-1\r\nFN:林小\r\nN:林;小;;;\r\nNICKNAME:小林\r\nEMAIL:lin@example.com\r\nEND:VCARD\r\n"


def load(pack: str, part: str = "server") -> Any:
    spec = importlib.util.spec_from_file_location(f"test_{pack}_{part}", PACKS / pack / part / "tools.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def secrets_for(root: Path, server: RadicaleServer) -> Path:
    secrets = root / "secrets"
    secrets.mkdir(exist_ok=True)
    for name, value in (("CARDDAV_URL", server.book_url), ("CARDDAV_USERNAME", USER), ("CARDDAV_PASSWORD", PASSWORD)):
        (secrets / name).write_text(value + "\n", encoding="utf-8")
    return secrets


@pytest.fixture
def carddav() -> Iterator[RadicaleServer]:
    with RadicaleServer() as server:
        yield server


@pytest.fixture
def carddav_env(carddav: RadicaleServer, monkeypatch: Any) -> RadicaleServer:
    """The pack's secrets in this process's environment, as the sandbox passes them."""
    for name, value in (("CARDDAV_URL", carddav.book_url), ("CARDDAV_USERNAME", USER), ("CARDDAV_PASSWORD", PASSWORD)):
        monkeypatch.setenv(name, value)
    return carddav


def test_the_manifest_declares_its_secrets_egress_and_profile_api(tmp_path: Path, carddav: RadicaleServer) -> None:
    pack = load_pack(PACKS / "personal")
    assert pack.secrets == ["CARDDAV_URL", "CARDDAV_USERNAME", "CARDDAV_PASSWORD"] and pack.egress and pack.platform_api == ["profile"]
    categories = {name: tool.resolve_category({}) for name, tool in pack.tools.items()}
    assert categories == {"find_contacts": "observe", "resolve_recipient": "observe", "save_contact": "owner_data",
                          "remove_contact": "delete", "profile": "observe"}
    grant = grant_for([pack], platform_paths(tmp_path, secrets_dir=secrets_for(tmp_path, carddav)))
    assert grant.env["CARDDAV_URL"] == carddav.book_url and grant.env["CARDDAV_PASSWORD"] == PASSWORD
    assert grant.egress == [Rule("127.0.0.1", urlsplit(carddav.book_url).port or 0, "tcp")]  # the host and port of CARDDAV_URL, nothing else


def test_contacts_created_over_carddav_are_listed_found_and_resolved(carddav_env: RadicaleServer) -> None:
    for uid, card in (("alice-1", ALICE), ("lin-1", LIN)):
        carddav_env.add_card(uid, card)
    server = load("personal")
    listed = server.find_contacts({})
    assert listed["status"] == "succeeded" and [c["name"] for c in listed["content"]["items"]] == ["Alice Wang", "林小"]
    assert [c["uid"] for c in server.find_contacts({"query": "example.com"})["content"]["items"]] == ["alice-1", "lin-1"]
    assert server.find_contacts({"query": "nobody"})["content"]["items"] == []
    lin = server.resolve_recipient({"name": "小林"})
    assert lin["status"] == "succeeded" and lin["content"]["address"] == "lin@example.com"
    added = server.save_contact({"name": "Bob Li", "given": "Bob", "family": "Li", "emails": ["bob@example.com"], "phones": ["+86 138 0000 0000"]})
    assert added["status"] == "succeeded" and added["effects"][0]["verification"] == "verified"
    with carddav_env.client() as client:  # it really is in the CardDAV store, as a vCard
        uid = added["content"]["items"][0]["uid"]
        card = client.get(f"{carddav_env.book_url}{uid}.vcf")
        assert card.status_code == 200 and "FN:Bob Li" in card.text and "bob@example.com" in card.text
    phone = server.resolve_recipient({"name": "bob", "channel": "phone"})
    assert phone["content"]["address"] == "+86 138 0000 0000"
    removed = server.remove_contact({"uid": uid})
    assert removed["status"] == "succeeded"
    assert server.resolve_recipient({"name": "Bob"})["error"]["code"] == "not_found"


def test_send_alice_a_note_resolves_alice_through_the_contacts(carddav_env: RadicaleServer, tmp_path: Path, monkeypatch: Any) -> None:
    """The messaging pack's send takes an address; the owner's "Alice" becomes one through
    the contacts first, and the note is written to the local outbox for her address: not
    sent (no mail server is configured), and its receipt says so."""
    carddav_env.add_card("alice-1", ALICE)
    personal, messaging = load("personal"), load("messaging")
    monkeypatch.setenv("YIMI_MAIL_DIR", str(tmp_path / "mail"))
    bare = messaging.send({"action": "send", "to": "Alice", "subject": "note", "body": "hi"})
    assert bare["status"] == "failed" and bare["error"]["code"] == "invalid_recipient"
    assert "personal__resolve_recipient" in bare["error"]["message"]
    alice = personal.resolve_recipient({"name": "Alice"})
    assert alice["status"] == "succeeded" and alice["content"]["address"] == "alice@example.com"
    sent = messaging.send({"action": "send", "to": alice["content"]["address"], "subject": "a note", "body": "see you at 3"})
    assert (sent["status"], sent["error"]["code"], sent["effects"]) == ("failed", "not_sent", [
        {"target": "local outbox", "action": "save", "verification": "verified"}])
    assert sent["content"]["items"][0]["to"] == "alice@example.com"
    assert any((tmp_path / "mail" / ".outbox" / "new").iterdir())


def test_a_name_two_contacts_share_is_ambiguous_and_asks(carddav_env: RadicaleServer) -> None:
    carddav_env.add_card("alice-1", ALICE)
    carddav_env.add_card("alice-2", ALICE_CHEN)
    server = load("personal")
    asked = server.resolve_recipient({"name": "alice"})
    assert asked["status"] == "failed" and asked["error"]["code"] == "ambiguous_recipient"
    assert {c["uid"] for c in asked["content"]["items"]} == {"alice-1", "alice-2"}
    assert "address" not in asked["content"] and "alice@example.com" in asked["summary"] and "achen@example.com" in asked["summary"]
    # the full name is not ambiguous
    assert server.resolve_recipient({"name": "Alice Chen"})["content"]["address"] == "achen@example.com"


def test_an_unreachable_or_unconfigured_address_book_is_never_an_empty_list(monkeypatch: Any) -> None:
    server = load("personal")
    monkeypatch.delenv("CARDDAV_URL", raising=False)
    assert server.find_contacts({})["error"]["code"] == "not_configured"
    monkeypatch.setenv("CARDDAV_URL", "http://127.0.0.1:9/owner/contacts/")
    lost = server.resolve_recipient({"name": "Alice"})
    assert (lost["status"], lost["error"]["code"]) == ("unknown", "DISCONNECTED")


def test_personal_contract_fake() -> None:
    report = run_contract(PACKS / "personal", fake=True)
    assert report.passed, report_text(report)
    assert report.skipped == ["an unreachable address book is DISCONNECTED, never an empty list"]


@pytest.mark.django_db(transaction=True)
def test_personal_contract_real_against_radicale_and_the_platform(internal_listener: Any, owner: Any, tmp_path: Path, carddav: RadicaleServer) -> None:
    from memory.assertions import store as assertions
    from memory.assertions.store import CommitRequest

    assertions.commit(CommitRequest(owner.pk, "profile-1", "core_profile.entry", {"text": "主人住在杭州", "doc": "user"}, 0))
    paths = platform_paths(tmp_path, secrets_dir=secrets_for(tmp_path, carddav), internal_socket=Path(os.fspath(internal_listener)))
    report = run_contract(PACKS / "personal", fake=False, paths=paths, owner_id=owner.pk)
    assert report.passed, report_text(report)
    assert len(report.cases) == 5 and not report.skipped
