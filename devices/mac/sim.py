"""The simulated Mac's side of the relay (``manage.py device_sim mac``; docs/protocol.md,
"The Mac relay"). No Django: ``cryptography`` and the standard library.

``MacAgent`` turns a ``mac.op`` frame into a ``mac.result`` frame: it checks the instance's
signature and the expiry, refuses while the owner paused it, decrypts, executes inside its
sandbox (devices/mac/sandbox.py), seals the result with the operation's result key and signs
it with the Mac's paired key. ``serve`` runs it on a ``DeviceConnection``; tests drive
``handle_op`` over their own socket.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from devices.mac import crypto as mac_crypto
from devices.mac.sandbox import MacSandbox


class MacAgent:
    def __init__(self, device_id: str, key: Ed25519PrivateKey, instance_public_key: str, sandbox: MacSandbox) -> None:
        self.device_id = device_id
        self.key = key
        self.instance_key = Ed25519PublicKey.from_public_bytes(base64.b64decode(instance_public_key))
        self.sandbox = sandbox
        self.x25519 = mac_crypto.derive_x25519(key)
        self.paused = False  # as the platform last said (mac.hello.ok, mac.paused)
        self.executed: list[tuple[str, str]] = []  # (op id, kind) executed, for the operator and tests

    def sign(self, message: bytes) -> str:
        return base64.b64encode(self.key.sign(message)).decode()

    def hello_frame(self) -> dict[str, Any]:
        public = mac_crypto.x25519_public_b64(self.x25519)
        return {"type": "mac.hello", "id": uuid.uuid4().hex, "x25519_public_key": public,
                "signature": self.sign(mac_crypto.hello_message(self.device_id, public))}

    def pause_frame(self, paused: bool, connection_nonce: str) -> dict[str, Any]:
        """The Mac's hotkey: pause (or resume) Yimi's operations on this Mac."""
        return {"type": "mac.pause", "id": uuid.uuid4().hex, "paused": paused,
                "signature": self.sign(mac_crypto.pause_message(self.device_id, connection_nonce, paused))}

    def note(self, frame: dict[str, Any]) -> None:
        """Learn the pause state from ``mac.hello.ok`` / ``mac.paused`` / ``mac.pause.ok``."""
        if isinstance(frame.get("paused"), bool):
            self.paused = frame["paused"]

    def handle_op(self, frame: dict[str, Any], *, now: float | None = None) -> dict[str, Any] | None:
        """The ``mac.result`` for one ``mac.op``; None for a frame that is not the platform's
        (a bad instance signature: it is dropped unanswered, as a forged op must be)."""
        op_id, kind = str(frame.get("op_id", "")), str(frame.get("kind", ""))
        epk, nonce, ciphertext, expires_at = frame.get("epk"), frame.get("nonce"), frame.get("ciphertext"), frame.get("expires_at")
        if not (isinstance(epk, str) and isinstance(nonce, str) and isinstance(ciphertext, str) and isinstance(expires_at, int)):
            return None
        message = mac_crypto.op_message(self.device_id, op_id, kind, epk, nonce, ciphertext, expires_at)
        try:
            self.instance_key.verify(base64.b64decode(str(frame.get("signature", ""))), message)
        except Exception:  # noqa: BLE001 - any failure: not signed by our instance
            return None
        keys = mac_crypto.mac_keys(self.x25519, epk, op_id)
        if (time.time() if now is None else now) > expires_at:
            result: dict[str, Any] = {"status": "error", "code": "op_expired", "message": "the operation expired before it arrived"}
        elif self.paused:
            result = {"status": "error", "code": "paused", "message": "the owner paused Yimi's operations on this Mac"}
        else:
            try:
                payload = mac_crypto.open_sealed(keys.op_key, nonce, ciphertext, mac_crypto.associated_data(op_id, kind))
            except mac_crypto.SealError as exc:
                result = {"status": "error", "code": "bad_payload", "message": str(exc)}
            else:
                if payload.get("kind") != kind:
                    result = {"status": "error", "code": "bad_payload", "message": "the sealed kind is not the frame's"}
                else:
                    result = self.sandbox.execute(kind, payload)
                    self.executed.append((op_id, kind))
        return self.result_frame(op_id, kind, result, keys)

    def result_frame(self, op_id: str, kind: str, result: dict[str, Any], keys: mac_crypto.OpKeys) -> dict[str, Any]:
        status = "ok" if result.get("status") == "ok" else "error"
        nonce, ciphertext = mac_crypto.seal(keys.result_key, result, mac_crypto.result_aad(op_id, kind, status))
        return {"type": "mac.result", "id": uuid.uuid4().hex, "op_id": op_id, "status": status, "nonce": nonce, "ciphertext": ciphertext,
                "signature": self.sign(mac_crypto.result_message(self.device_id, op_id, status, nonce, ciphertext))}


async def serve(conn: Any, agent: MacAgent, *, on_event: Callable[[str], None] | None = None, seconds: float | None = None) -> None:
    """Stay connected: register the key, then answer every ``mac.op`` (for ``seconds``, or
    until the connection closes)."""
    say = on_event or (lambda _text: None)
    await conn.send(agent.hello_frame())
    loop_deadline = None if seconds is None else time.monotonic() + seconds
    while loop_deadline is None or time.monotonic() < loop_deadline:
        try:
            frame = await conn.next_frame("mac.op", "mac.paused", "mac.hello.ok", "mac.pause.ok", "error", timeout=5.0)
        except Exception as exc:  # the simulator's "no frame within 5 s": keep waiting; a closed socket ends it
            if type(exc).__name__ == "ConnectionLost":
                raise
            continue
        if frame["type"] == "mac.op":
            result = agent.handle_op(frame)
            if result is None:
                say(f"dropped an op not signed by the paired instance ({frame.get('op_id')})")
                continue
            await conn.send(result)
            say(f"{frame.get('kind')} -> {result['status']}")
        elif frame["type"] == "error":
            say(f"error: {frame.get('code')}: {frame.get('message')}")
        else:
            agent.note(frame)
            if frame["type"] != "mac.hello.ok" or agent.paused:
                say(f"operations {'paused' if agent.paused else 'resumed'}")
