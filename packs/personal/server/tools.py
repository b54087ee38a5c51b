"""The personal pack: the owner's people (contacts in a CardDAV address book) and profile.

Contacts live in a real CardDAV store (RFC 6352; Radicale in tests and the documented
deployment). The address book's collection URL is the declared secret ``CARDDAV_URL``
(e.g. ``http://127.0.0.1:5232/owner/contacts/``), with ``CARDDAV_USERNAME`` /
``CARDDAV_PASSWORD`` for HTTP basic auth when set. The pack speaks CardDAV itself with
``httpx`` — ``REPORT addressbook-query`` to read every card, ``PUT`` with ``If-None-Match: *``
to create and ``If-Match`` to update, ``DELETE`` with ``If-Match`` — and reads and writes
vCards with ``vobject`` (the ``caldav`` library speaks CalDAV only).

Recipient resolution (``resolve_recipient``), the order the messaging skill follows:
1. something that already is an address (``x@y`` for email, digits for phone) is used as is;
2. otherwise the name is looked up in the contacts: a contact matches when the name equals
   (case-insensitively, spaces collapsed) its full name, its given name, its family name or
   one of its nicknames;
3. exactly one matching contact with exactly one (or one preferred) address → that address;
   two or more matching contacts → ``ambiguous_recipient`` listing them (the agent asks the
   owner, never picks); a contact with several addresses and none preferred →
   ``ambiguous_address``; nobody → ``not_found`` (ask the owner for the address).

The owner's profile is the platform's (memory's ``USER.md`` projection), read through
``/internal/profile/`` (``platform_api`` ``profile``). Never default to success: a CardDAV
server that cannot be reached is ``unknown``/``DISCONNECTED`` (or ``TIMEOUT``).
"""

from __future__ import annotations

import os
import re
import uuid
import xml.etree.ElementTree as ET  # noqa: S405 - the deployer's own CardDAV server
from typing import Any

import httpx
import vobject

from capabilities.packkit import (
    PlatformLost,
    PlatformNotConfigured,
    ToolRegistry,
    effect,
    egress_proxy_url,
    platform_call,
    receipt,
    value,
)

TOOLS = ToolRegistry()
SOURCE = "carddav"
URL_SECRET, USER_SECRET, PASSWORD_SECRET = "CARDDAV_URL", "CARDDAV_USERNAME", "CARDDAV_PASSWORD"
TIMEOUT_SECONDS = 10.0
NS = {"d": "DAV:", "c": "urn:ietf:params:xml:ns:carddav"}
QUERY = (
    '<?xml version="1.0" encoding="utf-8"?><c:addressbook-query xmlns:d="DAV:" xmlns:c="urn:ietf:params:xml:ns:carddav">'
    "<d:prop><d:getetag/><c:address-data/></d:prop></c:addressbook-query>"
)
EMAIL = re.compile(r"^[^@\s<>\"(),;:]+@[A-Za-z0-9.-]+$")
PHONE = re.compile(r"^\+?[0-9][0-9 ()-]{2,30}$")
UID = re.compile(r"^[A-Za-z0-9._-]{1,100}$")

FIND_SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string", "maxLength": 200, "description": "part of a name, nickname, email or phone; omit for all"},
                   "limit": {"type": "integer", "minimum": 1, "maximum": 200}},
}
RESOLVE_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 200, "description": "who the owner named, e.g. Alice"},
                   "channel": {"type": "string", "enum": ["email", "phone"]}},
    "required": ["name"],
}
SAVE_SCHEMA = {
    "type": "object",
    "properties": {
        "uid": {"type": "string", "maxLength": 100, "description": "omit to add a new contact; a contact's uid to update it"},
        "name": {"type": "string", "minLength": 1, "maxLength": 200, "description": "full name"},
        "given": {"type": "string", "maxLength": 100}, "family": {"type": "string", "maxLength": 100},
        "nicknames": {"type": "array", "items": {"type": "string", "maxLength": 100}, "maxItems": 10},
        "emails": {"type": "array", "items": {"type": "string", "maxLength": 320}, "maxItems": 10},
        "phones": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 10},
        "note": {"type": "string", "maxLength": 1000},
    },
    "required": ["name"],
}
REMOVE_SCHEMA = {"type": "object", "properties": {"uid": {"type": "string", "maxLength": 100}}, "required": ["uid"]}
PROFILE_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


class Unreachable(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class NotConfigured(Exception):
    pass


def refuse(code: str, message: str, *, values: list[dict[str, Any]] | None = None, content: dict[str, Any] | None = None) -> dict[str, Any]:
    return receipt("failed", summary=message, retry="forbidden", error=(code, message[:1000]), values=values, content=content)


def lost(exc: Unreachable, doubt: str, *, changes: bool, check_with: str = "find_contacts") -> dict[str, Any]:
    return receipt("unknown", summary=str(exc), unknowns=[doubt], retry="after_check" if changes else "allowed",
                   check_with=check_with if changes else None, error=(exc.code, str(exc)))


# --- vCards --------------------------------------------------------------------------------------


def norm(text: str) -> str:
    return " ".join(str(text).split()).casefold()


def contact_of(card_text: str, href: str = "", etag: str = "") -> dict[str, Any] | None:
    """A contact from one vCard (None if it does not parse)."""
    try:
        card = vobject.readOne(card_text)
    except Exception:  # noqa: BLE001 - a broken card is skipped, never guessed
        return None
    def values(name: str) -> list[Any]:
        return [c for c in card.contents.get(name, [])]
    emails, preferred_email = [], ""
    for item in values("email"):
        emails.append(str(item.value))
        types = [t.lower() for t in item.params.get("TYPE", [])]
        if "pref" in types or item.params.get("PREF"):
            preferred_email = preferred_email or str(item.value)
    phones = [str(t.value) for t in values("tel")]
    nicknames = [n.strip() for item in values("nickname") for n in str(item.value).split(",") if n.strip()]
    given = family = ""
    if values("n"):
        n = values("n")[0].value
        given, family = str(getattr(n, "given", "") or ""), str(getattr(n, "family", "") or "")
    fn = str(values("fn")[0].value) if values("fn") else " ".join(p for p in (given, family) if p)
    uid = str(values("uid")[0].value) if values("uid") else href.rstrip("/").rsplit("/", 1)[-1].removesuffix(".vcf")
    return {"uid": uid, "name": fn, "given": given, "family": family, "nicknames": nicknames, "emails": emails,
            "preferred_email": preferred_email, "phones": phones, "note": str(values("note")[0].value) if values("note") else "",
            "href": href, "etag": etag}


def card_text(contact: dict[str, Any]) -> str:
    card = vobject.vCard()
    card.add("uid").value = contact["uid"]
    card.add("fn").value = contact["name"]
    card.add("n").value = vobject.vcard.Name(family=contact.get("family", ""), given=contact.get("given", ""))
    if contact.get("nicknames"):
        card.add("nickname").value = ",".join(contact["nicknames"])
    for address in contact.get("emails", []):
        card.add("email").value = address
    for number in contact.get("phones", []):
        card.add("tel").value = number
    if contact.get("note"):
        card.add("note").value = contact["note"]
    return str(card.serialize())


def public(contact: dict[str, Any]) -> dict[str, Any]:
    return {k: contact[k] for k in ("uid", "name", "given", "family", "nicknames", "emails", "phones", "note")}


def names_of(contact: dict[str, Any]) -> set[str]:
    return {norm(n) for n in (contact["name"], contact["given"], contact["family"], *contact["nicknames"]) if n and n.strip()}


def matches_query(contact: dict[str, Any], query: str) -> bool:
    q = norm(query)
    return not q or any(q in norm(v) for v in (contact["name"], *contact["nicknames"], *contact["emails"], *contact["phones"]))


def resolve(contacts: list[dict[str, Any]], name: str, channel: str) -> dict[str, Any]:
    """The resolution rules of the module docstring, on a list of contacts (shared with the fake)."""
    wanted = name.strip()
    if channel == "email" and EMAIL.match(wanted) or channel == "phone" and PHONE.match(wanted):
        return receipt("succeeded", summary=f"{wanted} is already an address", content={"address": wanted, "source": "given", "items": []},
                       values=[value("matches", 0, "contact", SOURCE)])
    found = [c for c in contacts if norm(wanted) in names_of(c)]
    if not found:
        return refuse("not_found", f"no contact is called {wanted!r}: ask the owner for the address",
                      values=[value("matches", 0, "contact", SOURCE)])
    if len(found) > 1:
        people = sorted((public(c) for c in found), key=lambda c: (c["name"], c["uid"]))
        return refuse("ambiguous_recipient", f"{len(found)} contacts are called {wanted!r}: ask the owner which one ("
                      + "; ".join(f"{c['name']} <{', '.join(c['emails'] or c['phones'])}>" for c in people) + ")",
                      values=[value("matches", len(found), "contact", SOURCE)], content={"items": people})
    contact = found[0]
    addresses = contact["emails"] if channel == "email" else contact["phones"]
    preferred = contact["preferred_email"] if channel == "email" else ""
    if not addresses:
        return refuse("no_address", f"{contact['name']} has no {channel} in the contacts: ask the owner", content={"items": [public(contact)]})
    if len(addresses) > 1 and not preferred:
        return refuse("ambiguous_address", f"{contact['name']} has {len(addresses)} {channel} addresses and none preferred: ask the owner which",
                      content={"items": [public(contact)]})
    address = preferred or addresses[0]
    return receipt("succeeded", summary=f"{wanted} is {contact['name']} <{address}>",
                   content={"address": address, "source": "contacts", "items": [public(contact)]},
                   values=[value("matches", 1, "contact", SOURCE)])


def valid_contact(args: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    name = args.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 200 or "\n" in name:
        return None, "name must be one line of 1 to 200 characters"
    uid = args.get("uid")
    if uid is not None and (not isinstance(uid, str) or not UID.match(uid)):
        return None, "uid must be a contact's uid (letters, digits, . _ -)"
    lists = {}
    for key, pattern in (("emails", EMAIL), ("phones", PHONE), ("nicknames", None)):
        items = args.get(key) or []
        if not isinstance(items, list) or len(items) > 10 or not all(isinstance(i, str) and i.strip() and "\n" not in i for i in items):
            return None, f"{key} must be a list of at most 10 one-line strings"
        if pattern is not None and not all(pattern.match(i.strip()) for i in items):
            return None, f"every one of {key} must be a valid {key[:-1]}"
        lists[key] = [i.strip() for i in items]
    texts = {}
    for key in ("given", "family", "note"):
        text = args.get(key) or ""
        if not isinstance(text, str) or len(text) > (1000 if key == "note" else 100):
            return None, f"{key} is too long"
        texts[key] = text.strip()
    return {"uid": uid, "name": name.strip(), **texts, **lists}, ""


# --- CardDAV ------------------------------------------------------------------------------------


def _client() -> tuple[httpx.Client, str]:
    base = os.environ.get(URL_SECRET, "").strip()
    if not base:
        raise NotConfigured(f"the secret {URL_SECRET} is not set")
    user, password = os.environ.get(USER_SECRET, ""), os.environ.get(PASSWORD_SECRET, "")
    auth = httpx.BasicAuth(user, password) if user else None
    # The environment is not read (no .netrc, no stray proxy); the sandbox's egress proxy is
    # passed explicitly (the pack's declared egress: the host of CARDDAV_URL).
    client = httpx.Client(auth=auth, timeout=TIMEOUT_SECONDS, trust_env=False, proxy=egress_proxy_url())
    return client, base.rstrip("/") + "/"


def _request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    client, _ = _client()
    try:
        with client:
            return client.request(method, url, **kwargs)
    except httpx.TimeoutException:
        raise Unreachable("TIMEOUT", "the CardDAV server did not answer in time") from None
    except httpx.HTTPError:
        raise Unreachable("DISCONNECTED", "the CardDAV server could not be reached") from None


def read_contacts() -> list[dict[str, Any]]:
    """Every card of the address book (REPORT addressbook-query, Depth 1)."""
    _, base = _client()
    response = _request("REPORT", base, content=QUERY.encode(), headers={"Depth": "1", "Content-Type": "application/xml; charset=utf-8"})
    if response.status_code != 207:
        raise Unreachable("carddav_error", f"the CardDAV server answered HTTP {response.status_code} to the address book query")
    try:
        root = ET.fromstring(response.content)  # noqa: S314 - the deployer's own server
    except ET.ParseError:
        raise Unreachable("carddav_error", "the CardDAV server's answer was unreadable") from None
    contacts = []
    for item in root.findall("d:response", NS):
        href = item.findtext("d:href", default="", namespaces=NS)
        data = item.findtext(".//c:address-data", default="", namespaces=NS)
        etag = item.findtext(".//d:getetag", default="", namespaces=NS)
        contact = contact_of(data, href, etag) if data.strip() else None
        if contact is not None:
            contacts.append(contact)
    return sorted(contacts, key=lambda c: (norm(c["name"]), c["uid"]))


def put_contact(contact: dict[str, Any], etag: str | None) -> httpx.Response:
    _, base = _client()
    headers = {"Content-Type": "text/vcard; charset=utf-8", **({"If-Match": etag} if etag else {"If-None-Match": "*"})}
    return _request("PUT", f"{base}{contact['uid']}.vcf", content=card_text(contact).encode("utf-8"), headers=headers)


# --- tools --------------------------------------------------------------------------------------


@TOOLS("Find the owner's contacts whose name, nickname, email or phone contains query (all of them without one).", FIND_SCHEMA)
def find_contacts(args: dict[str, Any]) -> dict[str, Any]:
    query, limit = args.get("query", ""), args.get("limit", 50)
    if not isinstance(query, str) or len(query) > 200 or isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 200:
        return refuse("invalid_request", "query is text of at most 200 characters, limit 1 to 200")
    try:
        contacts = [public(c) for c in read_contacts() if matches_query(c, query)]
    except NotConfigured as exc:
        return refuse("not_configured", str(exc))
    except Unreachable as exc:
        return lost(exc, "which contacts the owner has", changes=False)
    return receipt("succeeded", summary=f"{len(contacts)} contacts", content={"items": contacts[:limit]},
                   values=[value("contacts", len(contacts), "contact", SOURCE)])


@TOOLS("Resolve who the owner named (\"Alice\") to one email address or phone number through the contacts; two matching contacts is ambiguous: ask the owner.", RESOLVE_SCHEMA)
def resolve_recipient(args: dict[str, Any]) -> dict[str, Any]:
    name, channel = args.get("name"), args.get("channel", "email")
    if not isinstance(name, str) or not name.strip() or len(name) > 200 or channel not in ("email", "phone"):
        return refuse("invalid_request", "name is 1 to 200 characters, channel email or phone")
    if channel == "email" and EMAIL.match(name.strip()) or channel == "phone" and PHONE.match(name.strip()):
        return resolve([], name, channel)
    try:
        contacts = read_contacts()
    except NotConfigured as exc:
        return refuse("not_configured", str(exc))
    except Unreachable as exc:
        return lost(exc, "who the owner meant", changes=False)
    return resolve(contacts, name, channel)


@TOOLS("Add a contact (without uid) or update one (with its uid): name, given/family names, nicknames, emails, phones, note.", SAVE_SCHEMA)
def save_contact(args: dict[str, Any]) -> dict[str, Any]:
    contact, problem = valid_contact(args)
    if contact is None:
        return refuse("invalid_request", problem)
    try:
        etag = None
        if contact["uid"]:
            current = next((c for c in read_contacts() if c["uid"] == contact["uid"]), None)
            if current is None:
                return refuse("not_found", f"there is no contact {contact['uid']}")
            etag = current["etag"]
        else:
            contact["uid"] = str(uuid.uuid4())
        response = put_contact(contact, etag)
        if response.status_code == 412:
            return receipt("failed", summary="the contact changed meanwhile: read it again", retry="after_check", check_with="find_contacts",
                           error=("conflict", "the CardDAV server refused the write: the card changed since it was read"))
        if response.status_code not in (200, 201, 204):
            return receipt("unknown", summary=f"the CardDAV server answered HTTP {response.status_code}", unknowns=["whether the contact was saved"],
                           retry="after_check", check_with="find_contacts", error=("carddav_error", f"HTTP {response.status_code}"))
        stored = next((c for c in read_contacts() if c["uid"] == contact["uid"]), None)
    except NotConfigured as exc:
        return refuse("not_configured", str(exc))
    except Unreachable as exc:
        return lost(exc, "whether the contact was saved", changes=True)
    verified = stored is not None and public(stored) == public({**contact, "preferred_email": ""})
    action = "update" if etag else "add"
    if not verified:
        return receipt("unknown", summary=f"saved {contact['name']} but it did not read back the same", unknowns=["whether the contact was saved intact"],
                       effects=[effect(f"contact:{contact['uid']}", action, "not_verified")], retry="after_check", check_with="find_contacts")
    return receipt("succeeded", summary=f"{'updated' if etag else 'added'} contact {contact['name']}",
                   effects=[effect(f"contact:{contact['uid']}", action, "verified")], content={"items": [public(contact)]},
                   values=[value("contacts_saved", 1, "contact", SOURCE)])


@TOOLS("Remove a contact by its uid.", REMOVE_SCHEMA)
def remove_contact(args: dict[str, Any]) -> dict[str, Any]:
    uid = args.get("uid")
    if not isinstance(uid, str) or not UID.match(uid):
        return refuse("invalid_request", "uid must be a contact's uid")
    try:
        current = next((c for c in read_contacts() if c["uid"] == uid), None)
        if current is None:
            return refuse("not_found", f"there is no contact {uid}")
        _, base = _client()
        href = current["href"] or f"{uid}.vcf"
        url = str(httpx.URL(base).join(href))
        response = _request("DELETE", url, headers={"If-Match": current["etag"]} if current["etag"] else {})
        if response.status_code not in (200, 204):
            return receipt("unknown", summary=f"the CardDAV server answered HTTP {response.status_code}", unknowns=["whether the contact was removed"],
                           retry="after_check", check_with="find_contacts", error=("carddav_error", f"HTTP {response.status_code}"))
        gone = all(c["uid"] != uid for c in read_contacts())
    except NotConfigured as exc:
        return refuse("not_configured", str(exc))
    except Unreachable as exc:
        return lost(exc, "whether the contact was removed", changes=True)
    if not gone:
        return receipt("unknown", summary=f"{current['name']} is still listed after the delete", unknowns=["whether the contact was removed"],
                       effects=[effect(f"contact:{uid}", "remove", "not_verified")], retry="after_check", check_with="find_contacts")
    return receipt("succeeded", summary=f"removed contact {current['name']}", effects=[effect(f"contact:{uid}", "remove", "verified")],
                   values=[value("contacts_removed", 1, "contact", SOURCE)])


def profile_call() -> tuple[int, Any]:
    return platform_call("GET", "profile/")


@TOOLS("Read the owner's profile (what Yimi keeps about them: memory's USER.md).", PROFILE_SCHEMA)
def profile(args: dict[str, Any]) -> dict[str, Any]:
    try:
        status, payload = profile_call()
    except PlatformNotConfigured as exc:
        return refuse("not_configured", str(exc))
    except PlatformLost as exc:
        return receipt("unknown", summary=str(exc), unknowns=["the owner's profile"], retry="allowed", error=(exc.code, str(exc)))
    if status != 200 or not isinstance(payload, dict) or not isinstance(payload.get("text"), str):
        error = payload.get("error") if isinstance(payload, dict) else None
        code = str(error.get("code")) if isinstance(error, dict) else f"http_{status}"
        return refuse(code, str(error.get("message", code)) if isinstance(error, dict) else f"the platform answered HTTP {status}")
    sections = payload.get("sections", [])
    return receipt("succeeded", summary=f"the owner's profile: {len(sections)} entries",
                   content={"text": payload["text"], "items": [{"text": s} for s in sections]},
                   values=[value("entries", len(sections), "entry", "yimi memory")])
