"""Ed25519 device signatures and the canonical messages they sign (docs/protocol.md).

Every signed message starts with a purpose tag, so a signature made for one purpose can
never be replayed as another.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from yimi_project.errors import YimiError


def decode_public_key(public_key_b64: str) -> Ed25519PublicKey:
    try:
        raw = base64.b64decode(public_key_b64, validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError, TypeError):
        raise YimiError("invalid_public_key", "public_key must be a base64 raw Ed25519 key (32 bytes)") from None


def verify(public_key_b64: str, message: bytes, signature_b64: object) -> bool:
    if not isinstance(signature_b64, str):
        return False
    try:
        signature = base64.b64decode(signature_b64, validate=True)
        decode_public_key(public_key_b64).verify(signature, message)
    except (binascii.Error, ValueError, InvalidSignature, YimiError):
        return False
    return True


def pairing_message(code: str, public_key_b64: str) -> bytes:
    return f"yimi-pair-v1\n{code}\n{public_key_b64}".encode()


def challenge_message(nonce: str) -> bytes:
    """What the server signs with the instance key when it opens a websocket."""
    return f"yimi-challenge-v1\n{nonce}".encode()


def auth_message(nonce: str, device_id: str) -> bytes:
    """What the device signs with its key to authenticate a websocket."""
    return f"yimi-ws-auth-v1\n{nonce}\n{device_id}".encode()


# X-Yimi-Nonce: fresh for every signed HTTP request.
HTTP_NONCE = re.compile(r"[A-Za-z0-9_-]{16,64}")


def http_message(method: str, host: str, path: str, timestamp: str, nonce: str, body: bytes) -> bytes:
    """What a device signs for one HTTP request (docs/protocol.md, "HTTP API for devices"):
    the lines ``yimi-http-v2``, the method (upper case), the Host header (lower case), the
    path with its query as in the request line, the timestamp (unix seconds, decimal),
    the nonce, and the SHA-256 of the body (lower-case hex), joined by ``\\n`` (no trailing
    newline), UTF-8."""
    digest = hashlib.sha256(body).hexdigest()
    return f"yimi-http-v2\n{method.upper()}\n{host.lower()}\n{path}\n{timestamp}\n{nonce}\n{digest}".encode()
