"""Push-to-talk holds that every process sees (issue 19: "no new pack starts during a call
or push-to-talk"; docs/memory.md "Cold packs").

The voice socket's ``push_to_talk`` frame pauses ambient analysis in the web process
(``voice.ambient``), but cold-pack rounds run in the Celery worker (or on the
embedded sweeper's thread), which cannot see that scheduler. So the socket also records
the hold here, one ``PushToTalkHold`` row per voice session: ``hold`` on ``down``,
``release`` on ``up``, on ``voice.stop`` and when the socket closes. A release that is lost
(the device vanished, the web process died) is no hold past ``expires_at``, the same
``PTT_HOLD_SECONDS`` (120 s) the request window and the analysis hold end at.

``busy`` is the check ``memory.archive.cold_store`` asks before each new pack; devices registers it
from ``DevicesConfig.ready`` (memory must not import devices). A pack already uploading
finishes: the check is only asked between packs.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from devices.models import PushToTalkHold
from voice.ambient import PTT_HOLD_SECONDS

REASON = "push_to_talk"


def hold(session_id: str, device: Any, *, now: datetime | None = None) -> PushToTalkHold:
    """Record (or renew: a second ``down``) the hold of ``session_id`` on ``device``, until
    ``PTT_HOLD_SECONDS`` from ``now``. Expired holds of the owner are dropped on the way."""
    now = now or timezone.now()
    PushToTalkHold.objects.filter(owner_id=device.owner_id, expires_at__lte=now).delete()
    row, _ = PushToTalkHold.objects.update_or_create(
        session=session_id,
        defaults={"owner_id": device.owner_id, "device": device, "started_at": now,
                  "expires_at": now + timedelta(seconds=PTT_HOLD_SECONDS)},
    )
    return row


def release(session_id: str) -> bool:
    """The key is up (or the session ended): True if a hold was recorded."""
    return PushToTalkHold.objects.filter(session=session_id).delete()[0] > 0


def busy(owner_id: int, *, now: datetime | None = None) -> str | None:
    """``memory.archive.cold_store``'s busy check: ``"push_to_talk"`` while any of the owner's
    sessions holds the key (and the hold has not expired), else None."""
    now = now or timezone.now()
    return REASON if PushToTalkHold.objects.filter(owner_id=owner_id, expires_at__gt=now).exists() else None
