"""Which secrets each pack was granted, as the pack hosts read it.

A secret belongs to the packs it was granted to, not to whichever pack names it: a pack
that declares ``CARDDAV_PASSWORD`` gets its value only if ``CARDDAV_PASSWORD`` was granted
to that pack. A grant names the pack and where it comes from, its **origin**: ``shipped``
(a pack in the platform's packs directory) or ``published`` (a version the pack registry
published, which lives in the registry's store). A grant to the shipped ``personal`` is not
one to a published pack called ``personal``, nor to a pack dropped into the packs directory
under a published pack's name.

The grants live in the database (``capabilities.registry.grants``, the only writer, from
``manage.py pack grant|revoke``, the admin and ``yimi_init``); after every change that
service projects them into ``secret_grants.json`` in the registry's directory, which
``sandbox.grant_for`` reads at every host start (a host starts on the event loop of any
process, where the database is not at hand; the registry's selection file works the same
way). No file, or one that cannot be read, grants nothing.

A pack host started without a declared secret is told which (``NOT_GRANTED_ENV``, a JSON
object pack → names; a ``YIMI_`` name no pack may declare) and answers every call of that
pack with a failed receipt whose error code is ``secret_not_granted`` and whose message
names the secrets, instead of running the pack without them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

GRANTS_FILE_NAME = "secret_grants.json"
NOT_GRANTED_ENV = "YIMI_SECRETS_NOT_GRANTED"
NOT_GRANTED = "secret_not_granted"
SHIPPED, PUBLISHED = "shipped", "published"
ORIGINS = (SHIPPED, PUBLISHED)


def grants_file() -> Path:
    return Path(settings.YIMI_PACK_REGISTRY_DIR) / GRANTS_FILE_NAME


def origin_of(pack_path: Path, shipped_dir: Path) -> str:
    """``shipped`` for a pack directly in the platform's packs directory, else ``published``
    (the registry's store, a candidate's copy, anywhere else)."""
    return SHIPPED if Path(pack_path).resolve().parent == Path(shipped_dir).resolve() else PUBLISHED


@dataclass(frozen=True)
class SecretGrants:
    granted: frozenset[tuple[str, str, str]] = frozenset()  # (origin, pack, secret)

    def allows(self, origin: str, pack: str, secret: str) -> bool:
        return (origin, pack, secret) in self.granted


def read_grants(path: Path | None = None) -> SecretGrants:
    """The grants in the projection file; nothing when it is absent or malformed. Read at
    every call (a host start), so a grant or a revocation counts for the next start."""
    try:
        data = json.loads((path or grants_file()).read_text(encoding="utf-8"))
        granted = {
            (origin, str(pack), str(secret))
            for origin in ORIGINS
            for pack, secrets in data.get(origin, {}).items()
            for secret in secrets
        }
    except (OSError, ValueError, TypeError, AttributeError):
        return SecretGrants()
    return SecretGrants(frozenset(granted))


def write_grants(rows: Iterable[tuple[str, str, str]], path: Path | None = None) -> None:
    """Project (origin, pack, secret) grants into the file, atomically (0600)."""
    # here: the pack host imports this module inside its sandbox, where yimi_project is not
    from yimi_project.files import write_atomically
    data: dict[str, dict[str, list[str]]] = {origin: {} for origin in ORIGINS}
    for origin, pack, secret in sorted(set(rows)):
        data[origin].setdefault(pack, []).append(secret)
    target = path or grants_file()
    text = json.dumps(data, sort_keys=True, indent=1)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and target.read_text(encoding="utf-8") == text:
        return
    write_atomically(target, text.encode(), mode=0o600)


def withheld_env(withheld: Mapping[str, list[str]]) -> dict[str, str]:
    """The host's environment entry naming what its packs were not granted."""
    return {NOT_GRANTED_ENV: json.dumps({pack: list(names) for pack, names in withheld.items()}, sort_keys=True)}


def withheld_from_env(environ: Mapping[str, str]) -> dict[str, list[str]]:
    """Inside the host: pack → the declared secrets it was started without."""
    try:
        data = json.loads(environ.get(NOT_GRANTED_ENV, "") or "{}")
        return {str(pack): [str(n) for n in names] for pack, names in data.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


def not_granted_message(pack: str, secrets: Iterable[str]) -> str:
    """Why a call of ``pack`` did not run, naming the secrets (never their values)."""
    return (
        f"the pack {pack} declares secrets not granted to it: {', '.join(secrets)}; it does not run without them. "
        f"The owner grants a secret to a pack with manage.py pack grant {pack} NAME, or in the admin (Secret grants)"
    )
