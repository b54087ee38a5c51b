"""The protected baseline (F5 step 4; seed report 4.2): a candidate whose diff touches
payments, real clicks and ride hailing, first-send consent, identity, care and guest
permissions, secrets and sandboxes, Mac remote access, or release and rollback asks the
owner once, with a card; approval lets it go on, refusal ends it honestly (the release's
state becomes ``refused``, with the reason, and it is never asked again).

``PROTECTED_BASELINE`` below is the one list, meant to be reviewed like code: each area
the seed names, with the repository paths (a trailing ``/`` is a directory) that carry
it. A path is protected when it equals an entry or lies under a directory entry.

The card is a ``BaselineCard`` row (one per release, ever), pushed to the owner's card
devices as a ``release.card`` frame (docs/protocol.md) and answered there with a signed
``release.answer`` (``answer_card``), or by the owner in the console (``answer_in_console``).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from releases import services
from releases.models import Release
from releases.request_models import BaselineCard
from yimi_project import push
from yimi_project.errors import YimiError
from yimi_project.ids import uuid_or_nil
from yimi_project.logs import log_event

if TYPE_CHECKING:  # devices/ is above releases/: only the device's fields and verify_signature are used
    from devices.models import Device

# The protected baseline, area by area. Review changes to this list like a change to the gates.
PROTECTED_BASELINE: dict[str, tuple[str, ...]] = {
    "payments": ("payments/", "brain/payment_execution.py", "packs/shop/"),
    "real clicks and ride hailing": ("packs/phone/", "packs/desktop/", "devices/mac_desktop.py"),
    "first-send consent": (
        "consent/", "brain/consent_execution.py", "capabilities/authorities.py", "capabilities/services.py",
    ),
    "identity": (
        "accounts/", "devices/signatures.py", "devices/authentication.py", "devices/faces.py",
        "devices/switch_signers.py", "devices/voice/services.py",
    ),
    "care and guest permissions": ("accounts/services.py", "accounts/models.py", "devices/services.py"),
    "secrets and sandboxes": (
        "yimi_project/secrets.py", "yimi_project/leaks.py", "yimi_project/call_capability.py", "brain/keyring.py",
        "capabilities/mcp_host/", "workshop/sandbox.py",
    ),
    "Mac remote access": (
        "devices/mac_relay.py", "devices/mac_crypto.py", "devices/mac_internal.py", "devices/mac_models.py",
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
