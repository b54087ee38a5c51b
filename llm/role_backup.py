"""Moving model settings between instances, and rotating the master key.

- ``export_settings``: every role with its provider key still sealed, plus the master key
  wrapped under a passphrase (scrypt, then AES-256-GCM): a backup is useless without the
  passphrase, and the settings and their key travel together (the model settings' store is
  backed up and restored with its master key).
- ``import_settings``: refuses a backup without the wrapped key, with a wrong passphrase, or
  whose keys do not open under it, before anything is written; otherwise it makes the
  backup's roles this instance's (sealed again under this instance's master key), in one
  transaction.
- ``rotate_master_key``: a new master key, every sealed key (current rows and revisions)
  re-wrapped in one transaction, then the key file replaced atomically.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt
from django.db import transaction
from django.utils import timezone

from llm import keyring, role_drafts, roles
from llm.models import ModelRole, ModelRoleRevision, ModelSettingsImport, RoleSource
from yimi_project.errors import YimiError
from yimi_project.files import fsync_dir, write_atomically
from yimi_project.logs import log_event

FORMAT = "yimi-model-settings"
FORMAT_VERSION = 1
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**15, 8, 1
WRAP_AAD = b"yimi-model-settings-master-key-v1"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: Any) -> bytes:
    try:
        return base64.b64decode(str(text), validate=True)
    except (binascii.Error, ValueError):
        raise YimiError("backup_invalid", "the backup is damaged (a field is not base64)") from None


def _kek(passphrase: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return Scrypt(salt=salt, length=32, n=n, r=r, p=p).derive(passphrase.encode())


def _check_passphrase(passphrase: str) -> None:
    if len(passphrase) < 8:
        raise YimiError("invalid_request", "the passphrase must have at least 8 characters")


def export_settings(passphrase: str, *, now: datetime | None = None) -> dict[str, Any]:
    """The backup document (JSON-ready). The master key leaves only wrapped."""
    _check_passphrase(passphrase)
    master = keyring.master_key()
    salt, nonce = os.urandom(16), os.urandom(12)
    wrapped = AESGCM(_kek(passphrase, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)).encrypt(nonce, master, WRAP_AAD)
    marker = roles.import_marker()
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "exported_at": (now or timezone.now()).isoformat(),
        "master_key": {
            "kdf": "scrypt", "n": SCRYPT_N, "r": SCRYPT_R, "p": SCRYPT_P, "salt": _b64(salt), "nonce": _b64(nonce),
            "wrapped": _b64(wrapped), "key_id": keyring.key_id(master),
        },
        "environment_import": {"imported_at": marker.imported_at.isoformat(), "roles": marker.roles} if marker else None,
        "roles": [
            {
                "role": row.role, "provider": row.provider, "base_url": row.base_url, "model": row.model,
                "options": row.options, "api_key_encrypted": row.api_key_encrypted, "source": row.source,
                "source_note": row.source_note, "version": row.version, "updated_at": row.updated_at.isoformat(),
            }
            for row in ModelRole.objects.order_by("role")
        ],
    }


def unwrap_master_key(document: Mapping[str, Any], passphrase: str) -> bytes:
    block = document.get("master_key")
    if not isinstance(block, dict) or not block.get("wrapped"):
        raise YimiError(
            "backup_without_key",
            "this backup has no wrapped master key, so its provider keys cannot be restored; export it again with manage.py model_settings export",
        )
    try:
        n, r, p = int(block["n"]), int(block["r"]), int(block["p"])
    except (KeyError, TypeError, ValueError):
        raise YimiError("backup_invalid", "the backup's master key block is damaged") from None
    if block.get("kdf") != "scrypt" or not (2**14 <= n <= 2**20 and 1 <= r <= 32 and 1 <= p <= 16):
        raise YimiError("backup_invalid", "the backup's master key block uses parameters this version does not accept")
    try:
        master = AESGCM(_kek(passphrase, _unb64(block.get("salt")), n, r, p)).decrypt(
            _unb64(block.get("nonce")), _unb64(block.get("wrapped")), WRAP_AAD
        )
    except (InvalidTag, ValueError):
        raise YimiError("wrong_passphrase", "the passphrase does not open this backup's master key") from None
    if len(master) != 32 or keyring.key_id(master) != block.get("key_id"):
        raise YimiError("backup_invalid", "the backup's master key does not match its key id")
    return master


def import_settings(document: Mapping[str, Any], passphrase: str) -> list[str]:
    """Make the backup's roles this instance's; returns the roles restored.

    Steps: 1. check the format and unwrap the master key (refused: ``backup_without_key``,
    ``wrong_passphrase``, ``backup_invalid``); 2. open every sealed provider key with it
    and validate every role, still writing nothing; 3. in one transaction: ``roles.apply``
    each role (source ``import``; its key sealed again under this instance's master key),
    remove roles the backup does not have, and record the environment import as done, so a
    later start never imports over the restored settings.
    """
    if document.get("format") != FORMAT or document.get("version") != FORMAT_VERSION:
        raise YimiError("backup_invalid", f"this is not a {FORMAT} v{FORMAT_VERSION} backup")
    master = unwrap_master_key(document, passphrase)
    keyring.master_key()  # this instance's key must be there before anything is sealed under it
    entries = document.get("roles")
    if not isinstance(entries, list):
        raise YimiError("backup_invalid", "the backup has no list of roles")
    prepared: list[dict[str, Any]] = []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("role") not in roles.ROLES:
            raise YimiError("backup_invalid", "the backup lists a role this version does not know")
        blob = entry.get("api_key_encrypted")
        key = keyring.decrypt(blob, roles.key_aad(entry["role"]), key=master) if blob else None
        roles.validate_options(entry.get("options"))
        prepared.append({**entry, "api_key": key})
    exported = str(document.get("exported_at", ""))[:10]
    with transaction.atomic():
        for entry in prepared:
            roles.apply(
                entry["role"], provider=str(entry.get("provider", "")), base_url=str(entry.get("base_url", "")),
                model=str(entry.get("model", "")), options=entry.get("options"), api_key=entry["api_key"],
                source=RoleSource.IMPORT, note=f"backup of {exported}, was {entry.get('source', '?')}",
            )
        restored = [e["role"] for e in prepared]
        ModelRole.objects.exclude(role__in=restored).delete()
        if not ModelSettingsImport.objects.filter(id=1).exists():
            ModelSettingsImport.objects.create(id=1, imported_at=timezone.now(), roles=[])
    log_event("model_settings_restored", roles=restored)
    return restored


def rotate_master_key() -> str:
    """Replace the master key; returns the new key's id.

    Steps: 1. read the current key and write the new one to a temporary file beside the
    key file (0600, fsync); 2. in one transaction, under the settings lock, re-wrap every
    sealed key of ``ModelRole``, ``ModelRoleRevision`` and open drafts; 3. still inside it, rename the
    temporary file over the key file and fsync the directory. Anything failing before the
    rename leaves the old file and the old blobs; a commit failing after it puts the old key
    file back.
    """
    old = keyring.master_key()
    path = keyring.master_key_path()
    new = keyring.new_master_key()
    temporary = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise YimiError("model_master_key_unwritable", f"cannot write beside the master key file ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(keyring.encode_key(new))
            fh.flush()
            os.fsync(fh.fileno())
        replaced = False
        try:
            with transaction.atomic():
                roles.settings_lock()
                for model in (ModelRole, ModelRoleRevision):
                    for row in model.objects.select_for_update().exclude(api_key_encrypted=None):
                        assert row.api_key_encrypted is not None
                        plain = keyring.decrypt(row.api_key_encrypted, roles.key_aad(row.role), key=old)
                        row.api_key_encrypted = keyring.encrypt(plain, roles.key_aad(row.role), key=new)
                        row.save(update_fields=["api_key_encrypted"])
                role_drafts.rewrap_draft_keys(old, new)  # open drafts' new keys too
                os.replace(temporary, path)
                replaced = True
                fsync_dir(path.parent)
        except BaseException:
            if replaced:  # the database kept the old blobs: the old key goes back
                write_atomically(path, keyring.encode_key(old), mode=0o600)
            raise
    finally:
        temporary.unlink(missing_ok=True)
    log_event("model_master_key_rotated", key_id=keyring.key_id(new))
    return keyring.key_id(new)
