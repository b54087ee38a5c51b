"""Provider keys encrypted at rest: AES-256-GCM under one master key.

The master key is 32 random bytes, base64 in a secret file ``model_master_key``:
``$YIMI_SECRETS_DIR/model_master_key`` when the deployment mounts one there (only the web
and worker processes mount it), else ``$YIMI_DATA_DIR/model_master_key``, generated 0600 by
``manage.py yimi_init`` (``ensure_master_key``) the way the Django secret key and the
instance key are. Nothing else creates it: a missing key is an error
(``model_master_key_missing``), never a silently new key that would orphan the stored ones.

A blob is ``v1:<key id>:<base64(nonce ‖ ciphertext ‖ tag)>``; the key id (first 8 bytes of
the key's SHA-256, hex) says which master key sealed it, and the associated data (the
role name) binds a blob to its row, so a blob copied to another role does not decrypt.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings

from yimi_project.errors import YimiError
from yimi_project.secrets import read_secret, write_private_file

MASTER_KEY_FILE = "model_master_key"
VERSION = "v1"
NONCE_BYTES = 12


def master_key_path() -> Path:
    """The file the master key is read from (and that ``rotate-key`` replaces)."""
    mounted = Path(settings.SECRETS_DIR) / MASTER_KEY_FILE
    if mounted.is_file():
        return mounted
    return Path(settings.DATA_DIR) / MASTER_KEY_FILE


def ensure_master_key() -> bool:
    """Create the master key file if there is none (``yimi_init``); True if created."""
    if (Path(settings.SECRETS_DIR) / MASTER_KEY_FILE).is_file():
        return False
    return write_private_file(Path(settings.DATA_DIR) / MASTER_KEY_FILE, encode_key(new_master_key()))


def new_master_key() -> bytes:
    return secrets.token_bytes(32)


def encode_key(key: bytes) -> bytes:
    return base64.b64encode(key) + b"\n"


def decode_key(text: str) -> bytes:
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != 32:
        raise YimiError("model_master_key_invalid", "the model master key file does not hold a base64 32-byte key")
    return key


def master_key() -> bytes:
    path = master_key_path()
    text = read_secret(path.parent, path.name)
    if not text:
        raise YimiError(
            "model_master_key_missing",
            f"the model master key ({MASTER_KEY_FILE}) is missing: restore it, or run manage.py yimi_init on a new instance",
        )
    return decode_key(text)


def key_id(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:16]


def encrypt(plaintext: str, aad: str, *, key: bytes | None = None) -> str:
    key = master_key() if key is None else key
    nonce = os.urandom(NONCE_BYTES)
    sealed = AESGCM(key).encrypt(nonce, plaintext.encode(), aad.encode())
    return f"{VERSION}:{key_id(key)}:{base64.b64encode(nonce + sealed).decode()}"


def decrypt(blob: str, aad: str, *, key: bytes | None = None) -> str:
    key = master_key() if key is None else key
    version, _, rest = blob.partition(":")
    blob_key_id, _, body = rest.partition(":")
    if version != VERSION or not body:
        raise YimiError("model_key_undecryptable", "a stored provider key is not in a format this version reads")
    if blob_key_id != key_id(key):
        raise YimiError(
            "model_key_undecryptable",
            "a stored provider key was sealed under another model master key: restore the master key it was saved with",
        )
    try:
        raw = base64.b64decode(body, validate=True)
        return AESGCM(key).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], aad.encode()).decode()
    except (InvalidTag, binascii.Error, ValueError):
        raise YimiError("model_key_undecryptable", "a stored provider key does not decrypt under the model master key") from None


def blob_key_id(blob: str) -> str:
    """The id of the master key that sealed ``blob`` (for the console: which key, never the key)."""
    return blob.split(":", 2)[1] if blob.count(":") >= 2 else ""
