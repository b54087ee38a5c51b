"""Reverting a Yimi-built pack when the owner asks ("I don't want this version").

The owner says it in one sentence; the agent calls ``workshop__pack_revert`` and this takes
the pack's online version back through the registry (``capabilities.registry.revert``): its
previous version goes online again, or, for a first version, the pack is removed.

Only packs Yimi built herself can be reverted this way (the version online is a workshop
build or maintained by ``yimi``: ``registry.monitor.yimi_built``, the same packs the
maintenance cycle watches). A shipped pack changes with a release, an operator's published
pack with ``manage.py pack revert``: both are refused ``not_yimi_built`` and nothing
changes. The version checked is the version reverted: ``registry.revert`` is asked with it
as ``expected_digest``, so a publish in between is ``online_version_changed``, not a revert
of something nobody looked at.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from django.conf import settings

from capabilities import registry
from capabilities.registry.monitor import yimi_built
from capabilities.registry_models import PackVersion, RegisteredPack
from yimi_project.errors import YimiError

DIGEST = re.compile(r"^[0-9a-f]{64}$")


def _brief(version: PackVersion | None) -> dict[str, str] | None:
    return None if version is None else {"version": version.version, "digest": version.digest}


def revert_built_pack(name: Any, *, digest: Any = None, reason: str = "the owner asked for the previous version") -> dict[str, Any]:
    """Take the online version of the Yimi-built pack ``name`` back; ``digest``: only if it
    is this version. Returns ``{pack, reverted: {version, digest}, online: {version, digest}
    | None, removed}``, ``online`` read back from the registry after the change. Errors:
    ``invalid_request``, ``not_yimi_built``, ``nothing_to_revert``, ``online_version_changed``."""
    if not isinstance(name, str) or not name or len(name) > 64:
        raise YimiError("invalid_request", "name is the pack's name")
    if digest is not None and (not isinstance(digest, str) or not DIGEST.match(digest)):
        raise YimiError("invalid_request", "digest is a version's content digest (64 hex digits), or left out")
    if (Path(settings.YIMI_PACKS_DIR) / name / "plugin.json").exists():
        raise YimiError("not_yimi_built", f"{name} is a shipped pack: it changes with a release, not with a revert")
    entry = RegisteredPack.objects.select_related("active__candidate").filter(name=name).first()
    current = entry.active if entry is not None else None
    if current is None:
        raise YimiError("nothing_to_revert", f"no version of {name!r} that Yimi built is online")
    if not yimi_built(current):
        raise YimiError("not_yimi_built", f"{name} was published by an operator: it is reverted with manage.py pack revert")
    if digest is not None and digest != current.digest:
        raise YimiError("online_version_changed", f"the version online is {current.version} ({current.digest[:12]}), not {digest[:12]}")
    previous = registry.revert(name, reason=reason, expected_digest=current.digest)
    now = registry.online_digest(name)
    online = PackVersion.objects.filter(pack__name=name, digest=now, state=PackVersion.State.ACTIVE).first() if now else None
    return {"pack": name, "reverted": _brief(current), "online": _brief(online), "removed": previous is None and online is None}
