"""The instance identity: an Ed25519 key pair that is this Yimi's own.

The private key lives in ``DATA_DIR/instance_ed25519.pem`` (0600), created once and kept;
the public key is handed to devices at pairing so they can check the server's signature
on every websocket challenge.
"""

from __future__ import annotations

import base64
from functools import lru_cache
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings

from yimi_project.secrets import write_private_file


def _key_path() -> Path:
    return Path(settings.DATA_DIR) / "instance_ed25519.pem"


def ensure_instance_identity() -> bool:
    """Create the instance key pair if it does not exist yet. True if it was created."""
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    created = write_private_file(_key_path(), pem)
    if created:
        _instance_key.cache_clear()
    return created


@lru_cache(maxsize=1)
def _instance_key() -> Ed25519PrivateKey:
    ensure_instance_identity()
    key = serialization.load_pem_private_key(_key_path().read_bytes(), password=None)
    assert isinstance(key, Ed25519PrivateKey)
    return key


def instance_public_key_b64() -> str:
    raw = _instance_key().public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return base64.b64encode(raw).decode()


def sign_as_instance(message: bytes) -> str:
    return base64.b64encode(_instance_key().sign(message)).decode()
