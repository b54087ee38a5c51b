"""A device simulator that speaks the real protocol (docs/protocol.md) to a running server.

Used by ``manage.py device_sim``, the end-to-end tests and ``bench/roundtrip.py``. It
depends only on ``websockets``, ``httpx`` and ``cryptography``, not on Django models.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import websockets
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from accounts.signatures import auth_message, challenge_message, http_message, pairing_message


class SimulatorError(Exception):
    pass


class ConnectionLost(SimulatorError):
    """The server closed the websocket (``code``: its close code; 1006 if it just dropped)."""

    def __init__(self, code: int | None, reason: str = "") -> None:
        super().__init__(f"the connection closed (code {code}{': ' + reason if reason else ''})")
        self.code, self.reason = code, reason


@dataclass
class DeviceIdentity:
    server: str
    device_id: str
    private_key: str  # raw Ed25519 private key, base64
    instance_public_key: str
    kind: str
    name: str

    @property
    def key(self) -> Ed25519PrivateKey:
        return Ed25519PrivateKey.from_private_bytes(base64.b64decode(self.private_key))

    def sign(self, message: bytes) -> str:
        return base64.b64encode(self.key.sign(message)).decode()

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(self), fh, indent=2)

    @classmethod
    def load(cls, path: Path) -> DeviceIdentity:
        return cls(**json.loads(path.read_text()))


def new_key() -> tuple[Ed25519PrivateKey, str]:
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return key, base64.b64encode(public).decode()


def _raw_private(key: Ed25519PrivateKey) -> str:
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    return base64.b64encode(raw).decode()


async def pair(
    server: str,
    code: str,
    *,
    kind: str = "phone",
    name: str = "simulated phone",
    capture_channels: list[str] | None = None,
    relay_via: str | None = None,
) -> DeviceIdentity:
    """Pair a new simulated device with a pairing code; returns its identity."""
    key, public = new_key()
    normalized = code.replace("-", "").replace(" ", "").upper()
    body: dict[str, Any] = {
        "code": code,
        "kind": kind,
        "name": name,
        "capture_channels": capture_channels if capture_channels is not None else ["phone_app"],
        "public_key": public,
        "signature": base64.b64encode(key.sign(pairing_message(normalized, public))).decode(),
    }
    if relay_via:
        body["relay_via"] = relay_via
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.post(server.rstrip("/") + "/api/pair/", json=body)
    if response.status_code != 201:
        raise SimulatorError(refusal("pairing", response))
    data = response.json()
    return DeviceIdentity(
        server=server.rstrip("/"),
        device_id=data["device_id"],
        private_key=_raw_private(key),
        instance_public_key=data["instance_public_key"],
        kind=kind,
        name=name,
    )


def signed_headers(
    sign: Callable[[bytes], str],
    device_id: str,
    method: str,
    host: str,
    path: str,
    body: bytes = b"",
    *,
    timestamp: int | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """The headers of a signed device HTTP request (docs/protocol.md). ``host`` is the
    Host header the request carries (``127.0.0.1:8000``); ``path`` includes the query."""
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    nonce = nonce or secrets.token_urlsafe(18)  # 24 characters of A-Z a-z 0-9 - _
    return {
        "Host": host,
        "X-Yimi-Device": device_id,
        "X-Yimi-Timestamp": stamp,
        "X-Yimi-Nonce": nonce,
        "X-Yimi-Signature": sign(http_message(method, host, path, stamp, nonce, body)),
    }


async def read_timeline(identity: DeviceIdentity, after: int = 0, limit: int = 50) -> dict[str, Any]:
    """One page of the timeline over the signed HTTP API (``GET /api/timeline/``)."""
    path = f"/api/timeline/?after={after}&limit={limit}"
    headers = signed_headers(identity.sign, identity.device_id, "GET", urlsplit(identity.server).netloc, path)
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(identity.server + path, headers=headers)
    if response.status_code != 200:
        raise SimulatorError(refusal("timeline", response))
    return response.json()


async def upload_image(identity: DeviceIdentity, data: bytes, content_type: str) -> dict[str, Any]:
    """Upload one JPEG or PNG image (``POST /api/images/``, signed over its bytes); returns
    the server's answer with ``image_id``, which an ``image`` frame then announces."""
    path = "/api/images/"
    headers = signed_headers(identity.sign, identity.device_id, "POST", urlsplit(identity.server).netloc, path, data)
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(identity.server + path, content=data, headers={**headers, "Content-Type": content_type})
    if response.status_code != 201:
        raise SimulatorError(refusal("image", response))
    return response.json()


def refusal(what: str, response: httpx.Response) -> str:
    """One line for a refused request: the server's error message and code when it sent the
    platform's error body (``{"error": {"code", "message"}}``), else its status and text."""
    try:
        error = response.json()["error"]
        return f"{what} refused: {error['message']} ({error['code']}, HTTP {response.status_code})"
    except (ValueError, KeyError, TypeError):
        text = " ".join(response.text.split())[:200]
        return f"{what} refused: HTTP {response.status_code} {text}".rstrip()


class DeviceConnection:
    """One authenticated websocket. Frames are read by a background task into a queue."""

    def __init__(self, identity: DeviceIdentity) -> None:
        self.identity = identity
        self.ws: Any = None
        self.ready: dict[str, Any] = {}
        self.nonce = ""
        self.frames: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.closed: asyncio.Future[tuple[int | None, str]] | None = None
        self._reader: asyncio.Task | None = None
        self.cards: dict[str, dict[str, Any]] = {}  # consent and payment cards seen, by id

    @property
    def ws_url(self) -> str:
        return self.identity.server.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + "/ws/device/"

    async def __aenter__(self) -> DeviceConnection:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> dict[str, Any]:
        self.ws = await websockets.connect(self.ws_url, max_size=2**20, open_timeout=10)
        challenge = json.loads(await asyncio.wait_for(self.ws.recv(), 10))
        if challenge.get("type") != "challenge":
            raise SimulatorError(f"expected a challenge, got {challenge}")
        server_key = Ed25519PublicKey.from_public_bytes(base64.b64decode(self.identity.instance_public_key))
        try:
            server_key.verify(base64.b64decode(challenge["server_signature"]), challenge_message(challenge["nonce"]))
        except Exception as exc:  # noqa: BLE001 - any failure means the server is not ours
            raise SimulatorError("the server's challenge signature does not match the paired instance") from exc
        signature = self.identity.sign(auth_message(challenge["nonce"], self.identity.device_id))
        await self.ws.send(json.dumps({"type": "auth", "device_id": self.identity.device_id, "signature": signature}))
        ready = json.loads(await asyncio.wait_for(self.ws.recv(), 10))
        if ready.get("type") != "ready":
            raise SimulatorError(f"authentication refused: {ready}")
        self.ready = ready
        self.nonce = challenge["nonce"]  # what connection-bound signatures sign (ride.permission, mac.pause)
        self.closed = asyncio.get_running_loop().create_future()
        self._reader = asyncio.ensure_future(self._read())
        return ready

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                frame = json.loads(raw)
                if frame.get("type") in CARD_TYPES:
                    self.cards[card_id(frame)] = frame
                await self.frames.put(frame)
        except websockets.ConnectionClosed:
            pass
        finally:
            if self.closed is not None and not self.closed.done():
                # The code the server closed with; 1006 if the connection dropped without one.
                self.closed.set_result((self.ws.close_code, self.ws.close_reason or ""))

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def send(self, frame: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(frame, ensure_ascii=False))

    async def next_frame(self, *types: str, timeout: float = 10.0) -> dict[str, Any]:
        """The next frame of one of ``types`` (any type if none given); others are dropped."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise SimulatorError(f"no {types or 'frame'} within {timeout} s")
            if self.frames.empty() and self.closed is not None and self.closed.done():
                raise ConnectionLost(*self.closed.result())
            getter = asyncio.ensure_future(self.frames.get())
            waiting: set[asyncio.Future[Any]] = {getter} if self.closed is None else {getter, self.closed}
            await asyncio.wait(waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                continue  # closed (raised above, once the queue is drained) or past the deadline
            frame = getter.result()
            if not types or frame.get("type") in types:
                return frame

    async def say(self, text: str, client_id: str | None = None) -> dict[str, Any]:
        """Send a text frame and return the server's ``text.ack``."""
        client_id = client_id or uuid.uuid4().hex
        await self.send({"type": "text", "id": client_id, "text": text})
        while True:
            frame = await self.next_frame("text.ack", "error")
            if frame.get("id") == client_id:
                if frame["type"] == "error":
                    raise SimulatorError(f"{frame['code']}: {frame['message']}")
                return frame

    async def send_image(self, image_id: str, *, about: str | None = None, captured_at: float | None = None) -> dict[str, Any]:
        """Announce an uploaded image (``image`` frame) and return the server's ``image.ack``."""
        client_id = uuid.uuid4().hex
        frame: dict[str, Any] = {"type": "image", "id": client_id, "image_id": image_id,
                                 "captured_at": int(time.time() if captured_at is None else captured_at)}
        if about:
            frame["about"] = about
        await self.send(frame)
        while True:
            reply = await self.next_frame("image.ack", "error")
            if reply.get("id") == client_id:
                if reply["type"] == "error":
                    raise SimulatorError(f"{reply['code']}: {reply['message']}")
                return reply

    async def reply_to(self, seq: int, *, timeout: float = 30.0, on_chunk: Any = None) -> tuple[list[str], dict[str, Any]]:
        """Collect the reply chunks for the utterance ``seq`` until ``reply.done`` or a
        ``notice``; returns (chunks, final frame)."""
        chunks: list[str] = []
        while True:
            frame = await self.next_frame("reply.chunk", "reply.done", "notice", timeout=timeout)
            if frame.get("reply_to_seq") != seq:
                continue
            if frame["type"] == "reply.chunk":
                chunks.append(frame["text"])
                if on_chunk is not None:
                    on_chunk(frame["text"])
            else:
                return chunks, frame

    async def ack(self, seq: int, status: str = "rendered") -> None:
        await self.send({"type": "ack", "seq": seq, "status": status})

    async def sync(self, after: int = 0, limit: int = 50) -> list[dict[str, Any]]:
        """Pull every entry after ``after``, page by page."""
        entries: list[dict[str, Any]] = []
        while True:
            request_id = uuid.uuid4().hex
            await self.send({"type": "sync", "id": request_id, "after": after, "limit": limit})
            while True:
                page = await self.next_frame("sync.page", "error")
                if page.get("id") == request_id:
                    break
            if page["type"] == "error":
                raise SimulatorError(f"{page['code']}: {page['message']}")
            entries.extend(page["entries"])
            after = page["next_after"]
            if not page["has_more"]:
                return entries

    async def open_cards(self) -> list[dict[str, Any]]:
        """The cards this connection has seen and not answered: pending cards come again
        right after ``ready``, so a ping's ``pong`` means they all arrived."""
        request_id = uuid.uuid4().hex
        await self.send({"type": "ping", "id": request_id})
        while (await self.next_frame("pong"))["id"] != request_id:
            pass
        return list(self.cards.values())

    async def answer_card(self, card: dict[str, Any], answer: str) -> dict[str, Any]:
        """Approve or deny a ``consent.card`` or ``payment.card``, signed as
        docs/protocol.md says; returns the ``consent.result``/``payment.result``."""
        if answer not in ("approve", "deny"):
            raise SimulatorError(f"an answer is approve or deny, not {answer!r}")
        request_id = uuid.uuid4().hex
        if card["type"] == "consent.card":
            frame = {"type": "consent.answer", "id": request_id, "card_id": card["card_id"], "answer": answer,
                     "signature": self.identity.sign(consent_answer_message(card, answer))}
        else:
            frame = {"type": "payment.answer", "id": request_id, "authorization_id": card["authorization_id"], "answer": answer,
                     "signature": self.identity.sign(payment_answer_message(card, answer))}
        await self.send(frame)
        while True:
            result = await self.next_frame("consent.result", "payment.result", "error")
            if result.get("id") == request_id:
                if result["type"] == "error":
                    raise SimulatorError(f"{result['code']}: {result['message']}")
                self.cards.pop(card_id(card), None)
                return result

    async def model_drafts(self) -> list[dict[str, Any]]:
        """The model drafts this device may confirm (``model.drafts``)."""
        request_id = uuid.uuid4().hex
        await self.send({"type": "model.drafts", "id": request_id})
        while True:
            frame = await self.next_frame("model.drafts", "error")
            if frame.get("id") == request_id:
                if frame["type"] == "error":
                    raise SimulatorError(f"{frame['code']}: {frame['message']}")
                return list(frame["drafts"])

    async def confirm_draft(self, draft: dict[str, Any], *, method: str = "face_id") -> dict[str, Any]:
        """Confirm a draft as the phone does after Face ID: recompute the digest from the
        contents shown (refusing a listing whose digest does not match them), sign
        ``draft_confirm_message`` and send ``model.draft.confirm``."""
        digest = draft_digest(draft)
        if digest != draft["digest"]:
            raise SimulatorError("the server's digest does not match the draft it shows: not confirming")
        issued_at, nonce, request_id = int(time.time()), secrets.token_urlsafe(24), uuid.uuid4().hex
        message = draft_confirm_message(self.identity.device_id, draft["id"], digest, issued_at, nonce, method)
        await self.send({"type": "model.draft.confirm", "id": request_id, "draft_id": draft["id"], "digest": digest,
                         "issued_at": issued_at, "nonce": nonce, "attestation": {"unlocked": True, "method": method},
                         "signature": self.identity.sign(message)})
        while True:
            frame = await self.next_frame("model.draft.confirm.ok", "error")
            if frame.get("id") == request_id:
                if frame["type"] == "error":
                    raise SimulatorError(f"{frame['code']}: {frame['message']}")
                return frame


def draft_digest(draft: dict[str, Any]) -> str:
    """SHA-256 of a model draft's contents as shown (docs/protocol.md, ``model.draft.confirm``)."""
    body = {k: draft[k] for k in ("role", "provider", "base_url", "model", "options", "key")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()


def draft_confirm_message(device_id: str, draft_id: str, digest: str, issued_at: int, nonce: str, method: str) -> bytes:
    """What a draft confirmation signs (docs/protocol.md)."""
    return f"yimi-model-draft-v1\n{device_id}\n{draft_id}\n{digest}\n{issued_at}\n{nonce}\nunlocked\n{method}".encode()


CARD_TYPES = ("consent.card", "payment.card")


def card_id(card: dict[str, Any]) -> str:
    """A card's id: ``card_id`` of a consent card, ``authorization_id`` of a payment card."""
    return str(card.get("card_id") or card.get("authorization_id") or "")


def consent_answer_message(card: dict[str, Any], answer: str) -> bytes:
    """What a consent answer signs (docs/protocol.md, "Signing cards"), from the card frame."""
    fields = ("card_id", "category", "tool", "target", "arguments_digest", "expires_at")
    return "\n".join(["yimi-consent-v1", *(str(card[f]) for f in fields), answer]).encode()


def payment_answer_message(card: dict[str, Any], answer: str, *, unlocked: bool = True) -> bytes:
    """What a payment answer signs, from the card frame; a phone signs only while unlocked
    (the simulated phone always is)."""
    if not unlocked:
        raise SimulatorError("a payment card is answered only on an unlocked phone")
    amount = f"{Decimal(card['amount']):.2f}"
    parts = ["yimi-payment-v1", card["authorization_id"], card["payee"], amount, card["currency"], card["expires_at"], answer, "unlocked"]
    return "\n".join(parts).encode()


# --- cards as a person reads them ------------------------------------------------------------

CONSENT_TITLES = {
    "send": "Send this?",
    "owner_data": "Change your data?",
    "delete": "Delete this?",
    "account": "Act on an account?",
    "physical": "Operate a device?",
    "workspace": "Write to the workspace?",
}
TIMELINE_WHO = {"utterance": "you", "reply": "yimi", "notice": "notice", "image": "photo"}


def _shown(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def card_lines(card: dict[str, Any], *, answer_with: str) -> list[str]:
    """A consent or payment card as a person reads it: a title, what it does (a consent
    card's arguments one per line, the preview as it is when it is not whole JSON), who gets
    it and how much where the card says so, and the commands that answer it (``answer_with``:
    the ``device_sim`` arguments after the card id, e.g. ``--key-file var/phone.json``)."""
    ident = card_id(card)
    lines: list[str]
    if card.get("type") == "payment.card":
        payee = card.get("merchant") or card.get("payee") or "?"
        lines = [f"[card {ident}] Pay {card.get('amount')} {card.get('currency') or ''} to {payee}?".replace("  ", " ")]
        items = "，".join(f"{i.get('item')} ×{i.get('quantity')}" for i in card.get("items") or [])
        if items:
            lines.append(f"  for: {items}")
        if card.get("eta"):
            lines.append(f"  arrives: {card['eta']}")
        if card.get("replacement"):
            lines.append(f"  the amount changed: this card replaces an earlier one ({card['replacement']} of 2)")
    else:
        category = str(card.get("category") or "")
        who = "you asked for this" if card.get("owner_requested") else "Yimi wants to do this on her own"
        tool = str(card.get("tool") or "").replace("__", " ")
        lines = [f"[card {ident}] {CONSENT_TITLES.get(category, 'Allow this?')} ({tool}; {who})"]
        target = str(card.get("target") or "")
        if target:
            lines.append(f"  {'to' if category == 'send' else 'on'}: {target}")
        preview = str(card.get("preview") or "")
        try:
            arguments = json.loads(preview)
        except ValueError:
            arguments = None
        if isinstance(arguments, dict):
            lines += [f"  {name}: {_shown(value)}" for name, value in arguments.items() if _shown(value) != target]
        elif preview:
            lines.append(f"  what: {_shown(preview, 500)}")
    lines.append(f"  approve: manage.py device_sim approve {ident} {answer_with}")
    lines.append(f"  deny:    manage.py device_sim deny {ident} {answer_with}")
    return lines


def timeline_line(entry: dict[str, Any]) -> str:
    """One timeline entry as ``sync`` prints it: ``[#seq] who: text`` (an image's text is
    its size and format, never its content; a notice says its code)."""
    who = TIMELINE_WHO.get(str(entry.get("kind")), str(entry.get("kind")))
    if entry.get("kind") == "notice" and entry.get("notice_code"):
        who = f"notice ({entry['notice_code']})"
    return f"[#{entry['seq']}] {who}: {entry.get('text', '')}"
