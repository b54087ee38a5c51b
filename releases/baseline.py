"""The protected baseline (flow F5 of docs/architecture.md): a candidate whose diff touches
payments, real clicks and ride hailing, first-send consent, identity, care and guest
permissions, secrets and sandboxes, Mac remote access, or release and rollback asks the
owner once, with a card; approval lets it go on, refusal ends it honestly (the release's
state becomes ``refused``, with the reason, and it is never asked again).

``PROTECTED_BASELINE`` below is the one list, meant to be reviewed like code: each area
above, with the repository paths (a trailing ``/`` is a directory) that carry
it. A path is protected when it equals an entry or lies under a directory entry.

The card is a ``BaselineCard`` row (one per release, ever; this is the only code that
writes ``BaselineCard``), pushed to the owner's card
devices as a ``release.card`` frame (docs/protocol.md) and answered there with a signed
``release.answer`` (``answer_card``), or by the owner in the console (``answer_in_console``).

Every release path runs the check (``check_release``): the build (``releases.builds``),
the gate (``releases.gate``) and the switch (``releases.switching``, which then goes on
only when the card, if there is one, is approved: ``require_clear``). What a candidate
changes is read from the release directories themselves (``release_changes``): its
MANIFEST against the MANIFEST of a release directory of its base commit on this host
(``current`` first), else ``git diff`` in the repository the build was made from. A
rollback request goes back only to a version whose card, if it had one, was approved
(``require_rollback_target``); it opens no card of its own.
"""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils import timezone

from accounts.models import Device
from accounts.services import get_owner
from releases import pointers, services
from releases.models import Release
from releases.request_models import BaselineCard
from yimi_project import push
from yimi_project.errors import YimiError
from yimi_project.ids import uuid_or_nil
from yimi_project.logs import log_event

# The protected baseline, area by area. Review changes to this list like a change to the gates.
PROTECTED_BASELINE: dict[str, tuple[str, ...]] = {
    "payments": ("payments/", "brain/payment_execution.py", "packs/shop/"),
    "real clicks and ride hailing": ("packs/phone/", "packs/desktop/", "devices/mac/desktop.py"),
    "first-send consent": (
        "consent/", "brain/consent_execution.py", "capabilities/authorities.py", "capabilities/services.py",
    ),
    "identity": (
        "accounts/", "voice/faces.py", "voice/services.py", "llm/model_settings.py",
    ),
    "care and guest permissions": ("accounts/services.py", "accounts/models.py", "devices/services.py"),
    "secrets and sandboxes": (
        "yimi_project/secrets.py", "yimi_project/leaks.py", "yimi_project/call_capability.py", "llm/keyring.py",
        "capabilities/mcp_host/", "workshop/sandbox.py", "capabilities/registry/grants.py", "capabilities/grant_admin.py",
    ),
    "Mac remote access": (
        "devices/mac/relay.py", "devices/mac/crypto.py", "devices/mac/internal.py", "devices/mac/models.py",
        "packs/owner-mac/",
    ),
    "release and rollback": ("releases/", "docker/"),
}
CARD_DEVICE_KINDS = ("phone", "glasses")  # where cards go (as consent cards)
ANSWERS = ("approve", "refuse")
MAX_PATHS = 50


@dataclass(frozen=True)
class Touched:
    """The protected areas a diff touches, and the paths that touch them."""

    areas: list[str]
    paths: list[str]

    def __bool__(self) -> bool:
        return bool(self.areas)


def protected_areas(paths: list[str]) -> Touched:
    """The areas of ``PROTECTED_BASELINE`` that any of ``paths`` (repository-relative) touches."""
    areas: list[str] = []
    hits: list[str] = []
    for raw in paths:
        path = raw.strip().removeprefix("./")
        for area, entries in PROTECTED_BASELINE.items():
            if any(path == e or (e.endswith("/") and path.startswith(e)) for e in entries):
                if area not in areas:
                    areas.append(area)
                if path not in hits:
                    hits.append(path)
    return Touched(areas, hits)


def changed_paths(repo: Path, base: str, commit: str) -> list[str]:
    """The paths a candidate changes against its base: ``git diff --name-only -M`` with both
    sides of a rename (moving a protected file out is touching it)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "diff", "--name-status", "-M", f"{base}..{commit}"],
            check=True, capture_output=True, text=True, timeout=60,
        ).stdout
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise YimiError("baseline_diff_failed", f"the candidate's diff against {base[:12]} cannot be read: {detail.strip()[:200]}") from exc
    paths: list[str] = []
    for line in out.splitlines():
        paths.extend(p for p in line.split("\t")[1:] if p)
    return paths


@dataclass(frozen=True)
class BaselineVerdict:
    """``clear`` (untouched), ``asking`` (a card waits for the owner), ``approved`` or ``refused``."""

    kind: str
    touched: Touched
    card: BaselineCard | None = None


def check(release: Release, paths: list[str], *, owner_id: int, now: datetime | None = None) -> BaselineVerdict:
    """May this candidate go on? Asks the owner once when its diff touches the baseline.

    Steps: 1. no protected area touched: ``clear``, no card; 2. the release's card exists:
    its answer (``asking`` while pending) — never a second card; 3. otherwise open one card
    (``pending``), push it to the owner's card devices after commit and record a
    ``baseline_asked`` event: ``asking``. A candidate that is ``refused`` stays refused.
    """
    touched = protected_areas(paths)
    if not touched:
        return BaselineVerdict("clear", touched)
    with transaction.atomic():
        Release.objects.select_for_update().get(id=release.id)  # one card per release, even from two callers
        card = BaselineCard.objects.filter(release=release).first()
        if card is None:
            card = BaselineCard.objects.create(
                owner_id=owner_id, release=release, areas=touched.areas, paths=touched.paths[:MAX_PATHS],
                summary=release.fix_line[:200], created_at=now or timezone.now(),
            )
            services.record_event("baseline_asked", release=release, to_build=release.build_id,
                                  reason=", ".join(touched.areas), details={"card_id": str(card.id)}, now=now)
            frame = card_frame(card, release)
            transaction.on_commit(lambda: push.to_owner_devices_sync(owner_id, CARD_DEVICE_KINDS, frame))
    kind = {"pending": "asking", "approved": "approved", "refused": "refused"}[card.state]
    return BaselineVerdict(kind, touched, card)


def manifest_entries(directory: Path, build_id: str) -> dict[str, str]:
    """A release directory's MANIFEST (``releases.builds.manifest``) as ``{path: mode and
    digest, or link target}``. The MANIFEST must be the one the build id is the digest of
    (``dir:<sha256>``): a MANIFEST edited after the build is refused."""
    try:
        body = (directory / "MANIFEST").read_bytes()
    except OSError as exc:
        raise YimiError("baseline_diff_failed", f"{directory.name} has no readable MANIFEST: {exc.strerror}") from None
    if build_id.startswith("dir:") and hashlib.sha256(body).hexdigest() != build_id[4:]:
        raise YimiError("baseline_diff_failed", f"the MANIFEST of {directory.name} is not the one build {build_id[:16]} was made from")
    entries: dict[str, str] = {}
    for line in body.decode("utf-8", "replace").splitlines()[1:]:  # the first line names the commit
        if line.startswith("link "):
            path, _, target = line[5:].partition(" -> ")
            entries[path] = f"link {target}"
        else:
            mode, _, rest = line.partition(" ")
            path, _, digest = rest.rpartition(" ")
            entries[path] = f"{mode} {digest}"
    return entries


def manifest_changes(base: dict[str, str], candidate: dict[str, str]) -> list[str]:
    """The paths added, removed or changed (content, mode or link target) between two
    MANIFESTs; a rename is both of its paths."""
    return sorted(p for p in base.keys() | candidate.keys() if base.get(p) != candidate.get(p))


def _base_directory(release: Release, root: Path | None) -> tuple[Path, str] | None:
    """A release directory of the candidate's base commit on this host, with its build id:
    ``current`` when it runs that commit, else any recorded release of it still on disk."""
    live = pointers.read_pointers(root).current
    if live is not None and live.commit == release.base_commit and (live.path / "MANIFEST").is_file():
        return live.path, live.build_id
    for row in Release.objects.filter(commit=release.base_commit).exclude(id=release.id).exclude(path=""):
        if (Path(row.path) / "MANIFEST").is_file():
            return Path(row.path), row.build_id
    return None


def release_changes(release: Release, *, root: Path | None = None, repo: Path | None = None) -> list[str]:
    """The paths a candidate changes against its base commit.

    Steps: 1. no base commit (the first install: nothing live yet to protect): none;
    2. a release directory of the base on this host: the two MANIFESTs compared;
    3. else the repository the build was made from (``repo``): ``changed_paths``;
    4. else ``baseline_base_unknown`` — what the candidate changes cannot be told, so it
    does not go on."""
    if not release.base_commit:
        return []
    candidate = Path(release.path) if release.path else None
    base = _base_directory(release, root)
    if candidate is not None and (candidate / "MANIFEST").is_file() and base is not None:
        return manifest_changes(manifest_entries(base[0], base[1]), manifest_entries(candidate, release.build_id))
    if repo is not None:
        return changed_paths(repo, release.base_commit, release.commit)
    raise YimiError(
        "baseline_base_unknown",
        f"no release directory of the base commit {release.base_commit[:12]} is on this host, so what "
        f"{release.build_id[:16]} changes cannot be told: rebuild it on the live version",
    )


def check_release(release: Release, stage: str, *, root: Path | None = None, repo: Path | None = None,
                  now: datetime | None = None) -> BaselineVerdict:
    """The protected-baseline check of one release path (``stage``: build, gate, switch).

    Steps: 1. the candidate's changes against its base (``release_changes``); 2. a change
    to the baseline with no owner account to ask: ``no_owner`` (it cannot go on); 3.
    ``check`` (asks once: the card is opened by whichever stage gets there first); 4. a
    ``baseline_check`` event with the stage and the verdict."""
    touched = protected_areas(release_changes(release, root=root, repo=repo))
    owner_id = 0
    if touched:
        owner = get_owner()
        if owner is None:
            raise YimiError("no_owner", f"{release.build_id[:16]} touches the protected baseline ({', '.join(touched.areas)}) "
                                        "and there is no owner to ask: it cannot go on")
        owner_id = owner.id
    verdict = check(release, touched.paths, owner_id=owner_id, now=now)
    services.record_event("baseline_check", release=release, to_build=release.build_id, reason=verdict.kind,
                          details={"stage": stage, "areas": touched.areas}, now=now)
    return verdict


def describe(release: Release) -> str:
    """One line for the operator: where the candidate stands with the protected baseline."""
    card = BaselineCard.objects.filter(release=release).first()
    if card is None:
        return "protected baseline: not touched"
    areas = ", ".join(card.areas)
    lines: dict[str, str] = {
        BaselineCard.State.PENDING: f"protected baseline: touches {areas}; a card waits for the owner's answer ({card.id})",
        BaselineCard.State.APPROVED: f"protected baseline: touches {areas}; the owner approved",
        BaselineCard.State.REFUSED: f"protected baseline: touches {areas}; the owner refused",
    }
    return lines[card.state]


def require_rollback_target(build_id: str | None) -> None:
    """Going back to ``build_id`` (``previous``): not to a release whose card the owner
    refused or has not answered (``baseline_refused``, ``baseline_waiting``). No card is
    opened: the owner asked for the rollback, and the version went live before."""
    card = BaselineCard.objects.filter(release__build_id=build_id or "").first()
    if card is None or card.state == BaselineCard.State.APPROVED:
        return
    areas = ", ".join(card.areas)
    if card.state == BaselineCard.State.REFUSED:
        raise YimiError("baseline_refused", f"the previous version is one the owner refused ({areas}); it is not gone back to")
    raise YimiError("baseline_waiting", f"the previous version changes the protected baseline ({areas}) and the owner has not answered its card")


def require_clear(release: Release) -> None:
    """For the switch: a candidate with a card goes on only once the owner approved it."""
    card = BaselineCard.objects.filter(release=release).first()
    if card is None or card.state == BaselineCard.State.APPROVED:
        return
    if card.state == BaselineCard.State.REFUSED:
        raise YimiError("baseline_refused", f"the owner refused this candidate ({', '.join(card.areas)}); it ends here")
    raise YimiError("baseline_waiting", f"this candidate touches the protected baseline ({', '.join(card.areas)}) and waits for the owner's answer")


def card_frame(card: BaselineCard, release: Release) -> dict[str, Any]:
    return {
        "type": "release.card",
        "card_id": str(card.id),
        "build_id": release.build_id,
        "summary": card.summary,
        "areas": list(card.areas),
        "paths": list(card.paths),
    }


def pending_card_frames(owner_id: int, device_id: Any) -> list[dict[str, Any]]:
    """The open cards a device gets again when it connects (if cards go to it)."""
    if device_id not in push.owner_devices(owner_id, CARD_DEVICE_KINDS):
        return []
    cards = BaselineCard.objects.filter(owner_id=owner_id, state=BaselineCard.State.PENDING).select_related("release")
    return [card_frame(card, card.release) for card in cards]


def card_message(card: BaselineCard, answer: str) -> bytes:
    """The canonical form of a card and an answer, which the owner's device signs."""
    return "\n".join(["yimi-release-card-v1", str(card.id), card.release.build_id, ",".join(card.areas), answer]).encode()


def answer_card(device: Device, card_id: Any, answer: Any, signature: Any) -> BaselineCard:
    """The owner answers from a device (``release.answer``), signed over the card and the
    answer. A guest device, another owner's card, a bad signature: nothing changes."""
    if answer not in ANSWERS:
        raise YimiError("invalid_frame", "answer must be approve or refuse")
    if device.is_guest:
        raise YimiError("forbidden", "a guest device cannot answer the owner's cards")
    card = BaselineCard.objects.filter(id=uuid_or_nil(card_id), owner_id=device.owner_id).select_related("release").first()
    if card is None:
        raise YimiError("not_found", "there is no such card")
    if not device.verify_signature(card_message(card, answer), signature):
        raise YimiError("bad_signature", "the answer is not signed by this device over this card")
    return _answer(card, answer, via="device", device=device)


def answer_in_console(owner_id: int, card_id: Any, answer: str) -> BaselineCard:
    """The owner answers in the console (the admin checked that this is the owner)."""
    if answer not in ANSWERS:
        raise YimiError("invalid_request", "answer must be approve or refuse")
    card = BaselineCard.objects.filter(id=uuid_or_nil(card_id), owner_id=owner_id).select_related("release").first()
    if card is None:
        raise YimiError("not_found", "there is no such card")
    return _answer(card, answer, via="console")


def _answer(card: BaselineCard, answer: str, *, via: str, device: Device | None = None, now: datetime | None = None) -> BaselineCard:
    """Steps: 1. conditional UPDATE ``pending`` → ``approved``/``refused`` (a second answer
    finds it closed: ``card_closed``, nothing changes); 2. refused: the release ends
    ``refused`` with the reason, from whatever not-yet-live state it was in; 3. an event."""
    now = now or timezone.now()
    new_state = BaselineCard.State.APPROVED if answer == "approve" else BaselineCard.State.REFUSED
    release = card.release
    with transaction.atomic():
        changed = BaselineCard.objects.filter(id=card.id, state=BaselineCard.State.PENDING).update(
            state=new_state, answered_at=now, answered_by=device, answered_via=via
        )
        if not changed:
            raise YimiError("card_closed", "this card was already answered")
        if new_state == BaselineCard.State.REFUSED:
            services.advance(
                release, Release.State.REFUSED, expected=(Release.State.BUILT, Release.State.GATED),
                reason=f"the owner refused a change to the protected baseline ({', '.join(card.areas)})",
            )
        services.record_event(f"baseline_{new_state}", release=release, to_build=release.build_id,
                              reason=", ".join(card.areas), details={"card_id": str(card.id), "via": via}, now=now)
    card.refresh_from_db()
    log_event("baseline_answered", card_id=str(card.id), answer=answer, via=via)
    return card
