"""Publishing, reverting and switching packs (flow F4), without a restart.

The database is the registry's truth (``RegisteredPack.active`` is the version online,
``RegisteredPack.enabled`` the switch); after every change ``write_selection`` projects it
into the selection file every process's pack loader reads (``manifest.read_selection``),
and the pack hosts of this process are refreshed (``runtime.refresh_pack_if_running``).
Other processes pick the change up at their next ``load_packs()``: the agent loop lists
tools every turn and the host manager restarts a host whose version changed.

``publish(digest)``, in order:

1. the candidate passed both checks (``candidate_refused``), the store still holds exactly
   what was checked (``candidate_changed``), no shipped pack has its name
   (``shipped_pack_name``), every secret it declares is still granted to it
   (``secret_not_granted``: a grant revoked since the check);
2. the online version is the one the candidate was built against, else
   ``online_version_changed`` (``already_online`` when it is this very candidate);
3. preload: the manifest loads and the pack's host starts in its sandbox and serves
   exactly the declared tools (``preload_failed``); nothing has changed yet;
4. switch: under a row lock, compare-and-swap ``RegisteredPack.active`` from the expected
   version to a new ``PackVersion`` (a publish that lost the race in between gets
   ``online_version_changed``); the old version is ``superseded``;
5. activate: write the selection file, check that the loader now serves the new version,
   refresh this process's host for the pack. If any of that fails, the switch is undone
   (compare-and-swap back, the new version marked ``reverted``), the selection rewritten,
   and ``activation_failed`` says what failed and whether restoring worked.

``revert(name)`` takes the online version back: its previous version goes online again,
or, for a first version, the pack is removed (nothing of it is online).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from capabilities.manifest import EXT, ManifestError, Pack, load_pack, load_packs, selection_file
from capabilities.mcp_host import limits as pack_limits
from capabilities.mcp_host import runtime
from capabilities.mcp_host.sandbox import PlatformPaths, grant_for, host_parameters
from capabilities.mcp_host.secret_grants import PUBLISHED
from capabilities.registry.candidates import verify_stored
from capabilities.registry.checks import directory_digest
from capabilities.registry.grants import NOT_GRANTED, not_granted
from capabilities.registry_models import PackCandidate, PackVersion, RegisteredPack
from yimi_project.errors import YimiError
from yimi_project.files import write_atomically
from yimi_project.logs import log_event

PRELOAD_TIMEOUT = 60.0


class PreloadError(Exception):
    pass


def online_digest(name: str) -> str | None:
    """The digest of the published version of ``name`` online now (None: none is)."""
    entry = RegisteredPack.objects.select_related("active").filter(name=name).first()
    return entry.active.digest if entry is not None and entry.active is not None else None


def publish(digest: str, *, progress: Callable[[str], None] | None = None) -> PackVersion:
    """Put a checked candidate online (the steps are in the module docstring)."""
    say = progress or (lambda _line: None)
    candidate = PackCandidate.objects.filter(digest=digest).first()
    if candidate is None:
        raise YimiError("not_found", "there is no candidate with this digest")
    if candidate.state != PackCandidate.State.PASSED:
        raise YimiError("candidate_refused", "the candidate did not pass the registry's checks")
    name = candidate.name
    if (Path(settings.YIMI_PACKS_DIR) / name).exists():
        raise YimiError("shipped_pack_name", f"a shipped pack is named {name!r}; a published pack needs a name of its own")
    if not verify_stored(candidate):
        raise YimiError("candidate_changed", "the registry's copy of the candidate is not what was checked")
    ext = candidate.manifest.get("extensions", {}).get(EXT, {})
    missing = not_granted(name, ext.get("secrets", []), origin=PUBLISHED)
    if missing:
        raise YimiError(NOT_GRANTED, f"secrets not granted to the pack {name} (revoked since its check): {', '.join(missing)}")
    expected = candidate.built_against or None
    online = online_digest(name)
    if online == digest:
        raise YimiError("already_online", "this candidate is the version online")
    if online != expected:
        raise YimiError("online_version_changed", "the online version changed since the candidate was built; build again against it")
    say("preloading: loading the manifest and starting the pack's host in its sandbox")
    try:
        tools = preload(Path(candidate.path))
    except PreloadError as exc:
        raise YimiError("preload_failed", f"the candidate did not start: {exc}") from None
    say(f"preloaded: {len(tools)} tool(s) served")
    version, previous = _switch(candidate, expected)
    say("activating: selection switched; refreshing the tool list")
    try:
        _activate(name, digest)
    except Exception as exc:  # noqa: BLE001 - any failure here is undone and reported
        restored = _undo(version, previous, f"activation failed: {type(exc).__name__}")
        how = "the previous selection is restored" if restored is None else f"restoring failed too ({restored})"
        log_event("pack_activation_failed", pack=name, digest=digest[:12], restored=restored is None)
        raise YimiError("activation_failed", f"activating {name} failed ({exc}); {how}") from None
    log_event("pack_published", pack=name, digest=digest[:12], previous=previous.digest[:12] if previous else "")
    say(f"{name} {candidate.version} ({digest[:12]}) is online")
    return version


def revert(name: str, *, reason: str, expected_digest: str | None = None) -> PackVersion | None:
    """Take the online version of ``name`` back ("I don't want this version"; or the
    monitor). Its previous version goes online again and is returned; a first version is
    removed (None is returned). ``expected_digest``: only if this version is still the one
    online (``online_version_changed`` otherwise: someone else changed it meanwhile)."""
    with transaction.atomic():
        entry = RegisteredPack.objects.select_for_update().filter(name=name).first()
        current = entry.active if entry is not None else None
        if entry is None or current is None:
            raise YimiError("nothing_to_revert", f"no published version of {name!r} is online")
        if expected_digest is not None and current.digest != expected_digest:
            raise YimiError("online_version_changed", "another version went online meanwhile")
        previous = current.previous
        now = timezone.now()
        PackVersion.objects.filter(pk=current.pk).update(state=PackVersion.State.REVERTED, ended_at=now, end_reason=reason[:300])
        if previous is not None:
            PackVersion.objects.filter(pk=previous.pk).update(state=PackVersion.State.ACTIVE, ended_at=None, end_reason="")
        swapped = RegisteredPack.objects.filter(pk=entry.pk, active=current).update(active=previous)
        if swapped != 1:  # cannot happen under the row lock; never switch on a lost race
            raise YimiError("online_version_changed", "another version went online meanwhile")
    _sync(name)
    log_event("pack_reverted", pack=name, digest=current.digest[:12], to=previous.digest[:12] if previous else "removed")
    if previous is not None:
        previous.refresh_from_db()
    return previous


def set_enabled(name: str, enabled: bool | None) -> RegisteredPack:
    """The registry's switch for a pack, shipped or published: on, off, or None (follow
    ``YIMI_PACKS_ENABLE`` and the manifest). ``YIMI_PACKS_DISABLE`` still wins
    (``capabilities.manifest.load_packs``)."""
    shipped = (Path(settings.YIMI_PACKS_DIR) / name / "plugin.json").exists()
    if not shipped and not RegisteredPack.objects.filter(name=name, active__isnull=False).exists():
        raise YimiError("not_found", f"there is no pack named {name!r}")
    entry, _ = RegisteredPack.objects.get_or_create(name=name)
    RegisteredPack.objects.filter(pk=entry.pk).update(enabled=enabled, updated_at=timezone.now())
    _sync(name)
    log_event("pack_switched", pack=name, enabled=enabled)
    entry.refresh_from_db()
    return entry


def write_selection() -> None:
    """Project the database into the selection file (atomically and durably, with
    ``yimi_project.files.write_atomically``), so every process's loader sees it whole,
    also after a crash."""
    published = {
        entry.name: {"path": entry.active.candidate.path, "digest": entry.active.digest}
        for entry in RegisteredPack.objects.select_related("active__candidate").filter(active__isnull=False)
        if entry.active is not None and entry.active.candidate is not None
    }
    switches = dict(RegisteredPack.objects.filter(enabled__isnull=False).values_list("name", "enabled"))
    text = json.dumps({"published": published, "switches": switches}, sort_keys=True, indent=1)
    target = selection_file()
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and target.read_text(encoding="utf-8") == text:
        return
    write_atomically(target, text.encode())


def preload(path: Path) -> list[str]:
    """Load the manifest in ``path`` and start the pack's host as the platform would
    (sandboxed, with what the pack declares); the tools it serves must be the manifest's.
    Returns the served tool names; raises PreloadError with the reason."""
    try:
        pack = load_pack(path)
    except ManifestError as exc:
        raise PreloadError(f"the manifest does not load: {exc}") from None
    return asyncio.run(_start_and_list(pack))


async def _start_and_list(pack: Pack) -> list[str]:
    from mcp import ClientSession, stdio_client  # here: the MCP SDK costs ~1 s of a start (test_startup_imports)

    limits = pack_limits.for_packs([pack])  # it must start within the limits it will run under
    args = ["-m", "capabilities.mcp_host.host", "--packs-dir", str(pack.path.parent), "--select", pack.name,
            *pack_limits.host_arguments(limits)]
    if settings.YIMI_PACKS_FAKE:
        args.append("--fake")
    params = host_parameters(
        args, grant_for([pack], PlatformPaths.from_settings()), readable=[pack.path.parent], tmp_bytes=limits.memory_mib * pack_limits.MiB
    )
    with tempfile.TemporaryFile("w+", encoding="utf-8") as errlog:
        try:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await asyncio.wait_for(session.initialize(), PRELOAD_TIMEOUT)
                listed = await asyncio.wait_for(session.list_tools(), PRELOAD_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - the reason the host did not start
            errlog.seek(0)
            tail = errlog.read()[-300:].strip()
            raise PreloadError(f"{type(exc).__name__}{': ' + tail if tail else ''}") from None
    served = sorted(t.name for t in listed.tools)
    declared = sorted(t.full_name for t in pack.tools.values())
    if served != declared:
        raise PreloadError(f"the host serves {served}, the manifest declares {declared}")
    return served


def _switch(candidate: PackCandidate, expected: str | None) -> tuple[PackVersion, PackVersion | None]:
    """Step 4: compare-and-swap the online version from ``expected`` to the candidate."""
    RegisteredPack.objects.get_or_create(name=candidate.name)
    with transaction.atomic():
        entry = RegisteredPack.objects.select_for_update(of=("self",)).select_related("active").get(name=candidate.name)
        previous = entry.active
        if (previous.digest if previous is not None else None) != expected:
            raise YimiError("online_version_changed", "the online version changed while the candidate was being preloaded")
        now = timezone.now()
        version = PackVersion.objects.create(
            pack=entry, origin=PackVersion.Origin.PUBLISHED, candidate=candidate, digest=candidate.digest,
            version=candidate.version, maintainer=candidate.maintainer, previous=previous,
            state=PackVersion.State.ACTIVE, activated_at=now,
        )
        if previous is not None:
            PackVersion.objects.filter(pk=previous.pk).update(
                state=PackVersion.State.SUPERSEDED, ended_at=now, end_reason=f"replaced by {candidate.digest[:12]}"
            )
        swapped = RegisteredPack.objects.filter(pk=entry.pk, active=previous).update(active=version, updated_at=now)
        if swapped != 1:
            raise YimiError("online_version_changed", "another version went online meanwhile")
    return version, previous


def _activate(name: str, digest: str) -> None:
    """Step 5: the selection file, the loader's view of it, this process's host."""
    write_selection()
    packs = load_packs()
    loaded = packs.packs.get(name)
    if name in packs.refused:
        raise RuntimeError(f"the loader refuses it: {packs.refused[name][:200]}")
    if loaded is not None and loaded.digest != digest:
        raise RuntimeError("the loader serves another version")
    if loaded is None and name not in packs.disabled:
        raise RuntimeError("the loader does not see it")
    runtime.refresh_pack_if_running(name)


def _undo(version: PackVersion, previous: PackVersion | None, reason: str) -> str | None:
    """Put ``previous`` back online if ``version`` still is; None when the selection is
    restored, else why not."""
    with transaction.atomic():
        swapped = RegisteredPack.objects.filter(pk=version.pack_id, active=version).update(active=previous, updated_at=timezone.now())
        if swapped == 1:
            now = timezone.now()
            PackVersion.objects.filter(pk=version.pk).update(state=PackVersion.State.REVERTED, ended_at=now, end_reason=reason)
            if previous is not None:
                PackVersion.objects.filter(pk=previous.pk).update(state=PackVersion.State.ACTIVE, ended_at=None, end_reason="")
    try:
        _sync(version.pack.name)
    except Exception as exc:  # noqa: BLE001 - reported to the caller
        return f"{type(exc).__name__}: {exc}"
    return None if swapped == 1 else "another version went online meanwhile"


def _sync(name: str) -> None:
    """The selection file from the database (a failure is the caller's), then this
    process's host for the pack. A host that fails to refresh is only logged: the change
    is made, and the host manager restarts a host of another version at its next use."""
    write_selection()
    try:
        runtime.refresh_pack_if_running(name)
    except Exception as exc:  # noqa: BLE001 - logged; see the docstring
        log_event("pack_host_refresh_failed", pack=name, error=type(exc).__name__)


def record_shipped_versions(packs_dir: Path | None = None) -> list[PackVersion]:
    """The version history of the shipped packs: a new ``PackVersion`` (origin shipped)
    whenever a shipped pack's content digest differs from the last one recorded (the
    maintenance cycle, ``manage.py yimi_init``, ``manage.py pack status`` and the console's
    pack list call this, so the registry lists every shipped pack from the first start).
    When nothing changed it is one query (the recorded digests) besides hashing the packs.
    Returns the new rows."""
    directory = Path(packs_dir or settings.YIMI_PACKS_DIR)
    recorded = set(
        PackVersion.objects.filter(origin=PackVersion.Origin.SHIPPED, state=PackVersion.State.ACTIVE).values_list("pack__name", "digest")
    )
    created = []
    for child in sorted(directory.iterdir()) if directory.is_dir() else []:
        if not (child / "plugin.json").is_file() or child.name.startswith((".", "_")):
            continue
        try:
            pack = load_pack(child)
        except ManifestError:
            continue
        digest = directory_digest(child)
        if (pack.name, digest) in recorded:
            continue
        entry, _ = RegisteredPack.objects.get_or_create(name=pack.name)
        with transaction.atomic():
            RegisteredPack.objects.select_for_update().get(pk=entry.pk)
            last = entry.versions.filter(origin=PackVersion.Origin.SHIPPED, state=PackVersion.State.ACTIVE).first()
            if last is not None and last.digest == digest:
                continue
            now = timezone.now()
            if last is not None:
                PackVersion.objects.filter(pk=last.pk).update(
                    state=PackVersion.State.SUPERSEDED, ended_at=now, end_reason="the release shipped another version"
                )
            created.append(
                PackVersion.objects.create(
                    pack=entry, origin=PackVersion.Origin.SHIPPED, digest=digest, version=pack.version,
                    maintainer=pack.maintainer, previous=last, state=PackVersion.State.ACTIVE, activated_at=now,
                )
            )
    return created
