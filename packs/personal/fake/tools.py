"""Fake personal: the real server's tools and receipts, against an in-memory address book.

It loads ``server/tools.py`` and replaces its CardDAV calls (``read_contacts``,
``put_contact``, ``_request`` for DELETE) and the platform's profile with in-memory ones;
the vCards are still written and parsed with ``vobject`` through the server's own
``card_text``/``contact_of``, and resolution is the server's ``resolve``. The address book
starts with Alice Wang (alice@example.com, nickname Ally) and Bob Li (bob@example.com).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import httpx

_SPEC = importlib.util.spec_from_file_location("yimi_pack_personal_server_for_fake", Path(__file__).resolve().parent.parent / "server" / "tools.py")
assert _SPEC is not None and _SPEC.loader is not None
server = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = server
_SPEC.loader.exec_module(server)

TOOLS = server.TOOLS
BASE = "http://fake.carddav/owner/contacts/"
PROFILE = ["主人叫测试，住在杭州", "喜欢喝茶"]


class FakeBook:
    def __init__(self) -> None:
        self.cards: dict[str, tuple[str, int]] = {}  # uid -> (vCard text, revision)
        for c in ({"uid": "fake-alice", "name": "Alice Wang", "given": "Alice", "family": "Wang", "nicknames": ["Ally"], "emails": ["alice@example.com"]},
                  {"uid": "fake-bob", "name": "Bob Li", "given": "Bob", "family": "Li", "emails": ["bob@example.com"]}):
            self.cards[c["uid"]] = (server.card_text(c), 1)

    def read(self) -> list[dict[str, Any]]:
        contacts = [server.contact_of(text, f"/owner/contacts/{uid}.vcf", f'"{rev}"') for uid, (text, rev) in self.cards.items()]
        return sorted((c for c in contacts if c is not None), key=lambda c: (server.norm(c["name"]), c["uid"]))

    def put(self, contact: dict[str, Any], etag: str | None) -> httpx.Response:
        current = self.cards.get(contact["uid"])
        if (etag is None and current is not None) or (etag is not None and (current is None or f'"{current[1]}"' != etag)):
            return httpx.Response(412)
        self.cards[contact["uid"]] = (server.card_text(contact), (current[1] + 1) if current else 1)
        return httpx.Response(201 if current is None else 204)

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        uid = url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".vcf")
        if method == "DELETE" and uid in self.cards:
            del self.cards[uid]
            return httpx.Response(204)
        return httpx.Response(404)


BOOK = FakeBook()
server.read_contacts = BOOK.read
server.put_contact = BOOK.put
server._request = BOOK.request
server._client = lambda: (httpx.Client(), BASE)
server.profile_call = lambda: (200, {"text": "\n§\n".join(PROFILE), "sections": PROFILE})
