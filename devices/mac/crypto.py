"""End-to-end encryption of Mac operations (docs/protocol.md, "The Mac relay").

Standard library and ``cryptography`` only: the simulator (and a native Mac client) uses the
same functions as the platform.

Keys. Pairing gives the Mac an Ed25519 key (signatures only). For encryption the Mac holds
an X25519 key that it **derives** from its Ed25519 private key (HKDF-SHA256 over the 32-byte
seed, info ``yimi-mac-x25519-v1``), so nothing new has to be stored on the Mac; the platform
cannot derive it (it never sees a private key), so the Mac **registers** the X25519 public
key in a ``mac.hello`` frame signed with its paired Ed25519 key
(``yimi-mac-hello-v1\\n{device_id}\\n{x25519_public_key}``). A Mac that keeps a separate
X25519 key is just as valid: only the signed public key matters to the platform.

Sealing an operation (platform → Mac). For each operation the platform makes an ephemeral
X25519 key, computes the shared secret with the Mac's registered key, and derives two
32-byte keys with HKDF-SHA256 (salt: the op id; info: ``yimi-mac-op-v1`` or
``yimi-mac-result-v1``, each followed by the ephemeral and the Mac's public key): one
encrypts the operation, the other the Mac's result. AES-256-GCM, a random 12-byte nonce,
and the frame's plain fields (op id, kind) as associated data. The ephemeral private key
and both derived keys live only in the memory of the platform process waiting for the
result: the channel layer, the database and the logs only ever carry ciphertext.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

OP_INFO = b"yimi-mac-op-v1"
RESULT_INFO = b"yimi-mac-result-v1"
X25519_INFO = b"yimi-mac-x25519-v1"


class SealError(Exception):
    """A payload that does not decrypt (wrong key, tampered ciphertext, bad encoding)."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise SealError("expected base64 text")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise SealError("not base64") from None


def _raw_public(key: X25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def derive_x25519(device_key: Ed25519PrivateKey) -> X25519PrivateKey:
    """The Mac's X25519 key, derived from its paired Ed25519 private key."""
    seed = device_key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=X25519_INFO).derive(seed)
    return X25519PrivateKey.from_private_bytes(raw)


def x25519_public_b64(key: X25519PrivateKey) -> str:
    return b64(_raw_public(key.public_key()))


def decode_x25519_public(text: Any) -> X25519PublicKey:
    raw = unb64(text)
    if len(raw) != 32:
        raise SealError("an X25519 public key is 32 bytes")
    return X25519PublicKey.from_public_bytes(raw)


def hello_message(device_id: str, x25519_public: str) -> bytes:
    """What the Mac signs with its paired Ed25519 key to register its X25519 key."""
    return f"yimi-mac-hello-v1\n{device_id}\n{x25519_public}".encode()


def op_message(device_id: str, op_id: str, kind: str, epk: str, nonce: str, ciphertext: str, expires_at: int) -> bytes:
    """What the platform signs with the instance key for one ``mac.op`` frame."""
    digest = hashlib.sha256(ciphertext.encode()).hexdigest()
    return f"yimi-mac-op-v1\n{device_id}\n{op_id}\n{kind}\n{epk}\n{nonce}\n{digest}\n{expires_at}".encode()


def result_message(device_id: str, op_id: str, status: str, nonce: str, ciphertext: str) -> bytes:
    """What the Mac signs with its paired key for one ``mac.result`` frame."""
    digest = hashlib.sha256(ciphertext.encode()).hexdigest()
    return f"yimi-mac-result-v1\n{device_id}\n{op_id}\n{status}\n{nonce}\n{digest}".encode()


def pause_message(device_id: str, nonce: str, paused: bool) -> bytes:
    """What a phone or the Mac signs to pause (or resume) Yimi's Mac operations; ``nonce``
    is the connection's challenge nonce."""
    return f"yimi-mac-pause-v1\n{device_id}\n{nonce}\n{'true' if paused else 'false'}".encode()


@dataclass(frozen=True)
class OpKeys:
    """The two keys of one operation (op, result), and the ephemeral public key."""

    op_key: bytes
    result_key: bytes
    epk: str


def _keys(shared: bytes, op_id: str, epk_raw: bytes, mac_raw: bytes) -> tuple[bytes, bytes]:
    def derive(info: bytes) -> bytes:
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=op_id.encode(), info=info + epk_raw + mac_raw).derive(shared)

    return derive(OP_INFO), derive(RESULT_INFO)


def platform_keys(mac_public: str, op_id: str) -> OpKeys:
    """The platform's side: a fresh ephemeral key against the Mac's registered key."""
    mac_key = decode_x25519_public(mac_public)
    ephemeral = X25519PrivateKey.generate()
    epk_raw = _raw_public(ephemeral.public_key())
    op_key, result_key = _keys(ephemeral.exchange(mac_key), op_id, epk_raw, _raw_public(mac_key))
    return OpKeys(op_key, result_key, b64(epk_raw))


def mac_keys(mac_private: X25519PrivateKey, epk: str, op_id: str) -> OpKeys:
    """The Mac's side: the same two keys from the frame's ephemeral public key."""
    epk_key = decode_x25519_public(epk)
    op_key, result_key = _keys(mac_private.exchange(epk_key), op_id, _raw_public(epk_key), _raw_public(mac_private.public_key()))
    return OpKeys(op_key, result_key, epk)


def associated_data(op_id: str, kind: str) -> bytes:
    return f"{op_id}\n{kind}".encode()


def result_aad(op_id: str, kind: str, status: str) -> bytes:
    """The associated data of a result: bound to its op, kind and stated status."""
    return associated_data(op_id, f"{kind}\nresult\n{status}")


def seal(key: bytes, payload: dict[str, Any], aad: bytes) -> tuple[str, str]:
    """(nonce, ciphertext), both base64, of the JSON of ``payload``."""
    nonce = os.urandom(12)
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    return b64(nonce), b64(AESGCM(key).encrypt(nonce, data, aad))


def open_sealed(key: bytes, nonce: Any, ciphertext: Any, aad: bytes) -> dict[str, Any]:
    """The payload sealed by ``seal``; ``SealError`` if it does not decrypt to a JSON object."""
    raw_nonce = unb64(nonce)
    if len(raw_nonce) != 12:
        raise SealError("the nonce is 12 bytes")
    try:
        data = AESGCM(key).decrypt(raw_nonce, unb64(ciphertext), aad)
    except InvalidTag:
        raise SealError("the payload does not decrypt with this operation's key") from None
    try:
        payload = json.loads(data)
    except ValueError:
        raise SealError("the payload is not JSON") from None
    if not isinstance(payload, dict):
        raise SealError("the payload is not a JSON object")
    return payload
