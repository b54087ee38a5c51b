"""Secrets are granted per pack (issue 35): the only writer of ``SecretGrant``.

A pack that declares a secret in its manifest gets its value only when the secret was
granted to that pack, named with its origin (``shipped``: in the platform's packs
directory; ``published``: through the registry). Another pack that declares the same
name gets nothing: its host starts without it and its calls answer
``secret_not_granted`` (``capabilities.mcp_host.sandbox``/``host``), and the registry
refuses a candidate declaring it (``checks.check_pack``, ``publish``).

- ``grant(pack, secret, origin=, by=)`` / ``revoke(...)``: the owner's or operator's word
  (``manage.py pack grant|revoke``, the admin's Secret grants). A revocation counts from
  the pack's next host start; a running host keeps what it was started with.
- ``grant_shipped_secrets()``: ``yimi_init`` and the maintenance cycle grant the shipped
  packs the secrets ``SHIPPED_SECRETS`` lists, the one reviewed list (a pack dropped into
  the packs directory is not in it, whatever it declares). A grant that exists, or was
  revoked, is left as it is.
- ``write_grants_file()``: after every change the grants in force are projected into the
  file the pack hosts read (``secret_grants.json`` in the registry's directory).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from capabilities.manifest import ManifestError, load_pack
from capabilities.mcp_host.secret_grants import NOT_GRANTED, ORIGINS, PUBLISHED, SHIPPED, write_grants
from capabilities.registry_models import SecretGrant
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

# The secrets each shipped pack was made for, granted to it at install (yimi_init) and by
# the maintenance cycle. Reviewed like code: a new secret for a shipped pack is added here.
SHIPPED_SECRETS: dict[str, tuple[str, ...]] = {
    "delivery": ("PARCELS_API_URL",),
    "mijia": ("MIJIA_DEVICES",),
    "personal": ("CARDDAV_URL", "CARDDAV_USERNAME", "CARDDAV_PASSWORD"),
    "phone": ("PHONE_API_URL", "PHONE_API_TOKEN", "PHONE_MODEL_URL"),
}
# The manifest schema's rules for pack names and secret names.
PACK_NAME = re.compile(r"^[a-z](?:[a-z0-9]|_(?!_)|-(?!-)){1,31}$")
SECRET_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")


def shipped_grant_rows() -> list[tuple[str, str, str]]:
    """``SHIPPED_SECRETS`` as (origin, pack, secret) rows."""
    return [(SHIPPED, pack, secret) for pack, secrets in SHIPPED_SECRETS.items() for secret in secrets]


def default_origin(pack_name: str) -> str:
    """``shipped`` when the platform's packs directory holds a pack of this name, else
    ``published``."""
    return SHIPPED if (Path(settings.YIMI_PACKS_DIR) / pack_name / "plugin.json").is_file() else PUBLISHED


def validate_grant(pack_name: str, secret: str, origin: str) -> None:
    if not PACK_NAME.match(pack_name):
        raise YimiError("invalid_request", f"{pack_name[:40]!r} is not a pack name")
    if not SECRET_NAME.match(secret) or secret.startswith("YIMI_"):
        raise YimiError("invalid_request", f"{secret[:70]!r} is not a secret a pack may declare (A-Z, 0-9, _; not YIMI_)")
    if origin not in ORIGINS:
        raise YimiError("invalid_request", f"origin is {' or '.join(ORIGINS)}, not {origin[:20]!r}")


def grant(pack_name: str, secret: str, *, origin: str | None = None, by: str) -> SecretGrant:
    """Grant ``secret`` to the pack ``pack_name`` of ``origin`` (default: ``default_origin``).
    Granting again what was revoked grants it anew; granting what is granted changes
    nothing. A published pack may be granted a secret before it is published (the
    registry refuses it until then)."""
    origin = origin or default_origin(pack_name)
    validate_grant(pack_name, secret, origin)
    now = timezone.now()
    with transaction.atomic():
        row, created = SecretGrant.objects.select_for_update().get_or_create(
            pack_name=pack_name, origin=origin, secret=secret, defaults={"granted_by": by[:150], "granted_at": now}
        )
        if not created and not row.granted:
            SecretGrant.objects.filter(pk=row.pk).update(granted=True, granted_by=by[:150], granted_at=now, revoked_by="", revoked_at=None)
            row.refresh_from_db()
    write_grants_file()
    log_event("pack_secret_granted", pack=pack_name, origin=origin, name=secret, by=by)
    return row


def revoke(pack_name: str, secret: str, *, origin: str | None = None, by: str) -> SecretGrant:
    """Revoke a grant (``not_granted`` when there is none in force). The pack's next host
    start goes without the secret; one running now keeps it until it stops."""
    origin = origin or default_origin(pack_name)
    validate_grant(pack_name, secret, origin)
    with transaction.atomic():
        row = SecretGrant.objects.select_for_update().filter(pack_name=pack_name, origin=origin, secret=secret, granted=True).first()
        if row is None:
            raise YimiError("not_granted", f"{secret} is not granted to the {origin} pack {pack_name}")
        SecretGrant.objects.filter(pk=row.pk).update(granted=False, revoked_by=by[:150], revoked_at=timezone.now())
        row.refresh_from_db()
    write_grants_file()
    log_event("pack_secret_revoked", pack=pack_name, origin=origin, name=secret, by=by)
    return row


def grant_shipped_secrets(packs_dir: Path | None = None, *, by: str = "yimi_init") -> list[SecretGrant]:
    """Grant each shipped pack in the packs directory the secrets ``SHIPPED_SECRETS`` lists
    for it and its manifest declares, unless a grant (in force or revoked) exists. Always
    rewrites the projection (a lost file comes back). Returns the new grants."""
    directory = Path(packs_dir or settings.YIMI_PACKS_DIR)
    existing = set(SecretGrant.objects.filter(origin=SHIPPED).values_list("pack_name", "secret"))
    created = []
    for name, listed in sorted(SHIPPED_SECRETS.items()):
        try:
            declared = load_pack(directory / name).secrets
        except ManifestError:
            continue
        for secret in listed:
            if secret in declared and (name, secret) not in existing:
                row, made = SecretGrant.objects.get_or_create(
                    pack_name=name, origin=SHIPPED, secret=secret, defaults={"granted_by": by[:150], "granted_at": timezone.now()}
                )
                if made:
                    created.append(row)
    write_grants_file()
    if created:
        log_event("pack_secrets_granted_to_shipped", grants=len(created))
    return created


def grants_in_force() -> list[tuple[str, str, str]]:
    return list(SecretGrant.objects.filter(granted=True).values_list("origin", "pack_name", "secret"))


def write_grants_file() -> None:
    """Project the grants in force into the file the pack hosts read."""
    write_grants(grants_in_force())


def not_granted(pack_name: str, declared: Iterable[str], *, origin: str) -> list[str]:
    """The declared secrets not granted to this pack, in the manifest's order."""
    declared = list(declared)
    if not declared:
        return []
    granted = set(
        SecretGrant.objects.filter(pack_name=pack_name, origin=origin, granted=True, secret__in=declared).values_list("secret", flat=True)
    )
    return [name for name in declared if name not in granted]


__all__ = [
    "NOT_GRANTED", "SHIPPED_SECRETS", "default_origin", "grant", "grant_shipped_secrets", "grants_in_force", "not_granted",
    "revoke", "shipped_grant_rows", "validate_grant", "write_grants_file",
]
