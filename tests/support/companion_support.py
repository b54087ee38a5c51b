"""A call's transcript as the voice path stores it, for the companion tests (issue 21).

A spoken request in a call is a ``VoiceUtterance`` (with its call) whose timeline entry
holds the words, in the scope voice identity decided; Yimi's answer is a reply entry to it.
``TranscribedCall`` writes exactly that shape through the timeline service, without audio:
the audio path itself is tested in test_voice_session.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone


def second_owner_device(username: str = "other") -> Any:
    """Another account with a device of its own (two owners on one database)."""
    import base64
    import os

    from django.contrib.auth import get_user_model

    from accounts.models import Device

    user = get_user_model().objects.create_user(username, password="another long password")
    return Device.objects.create(owner=user, name="other phone", kind="phone", capture_channels=["phone_app"],
                                 public_key=base64.b64encode(os.urandom(32)).decode())


@dataclass
class TranscribedCall:
    """One call on ``device``: ``owner`` / ``guest`` add an utterance, ``yimi`` a reply to
    the last one, ``hang_up`` ends it."""

    device: Any
    call_id: str = "call-1"
    call: Any = None
    last: Any = None
    entries: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        from accounts import voice as identity

        self.call = identity.start_call(self.device, self.call_id, "phone_app")

    def _utterance(self, text: str, scope: str) -> Any:
        from memory.timeline.entries import append_entry
        from voice.models import VoiceUtterance

        entry = append_entry(owner_id=self.device.owner_id, kind="utterance", text=text, device_id=self.device.id,
                             client_id=f"voice-{uuid.uuid4().hex}", scope=scope)
        VoiceUtterance.objects.create(
            owner_id=self.device.owner_id, device=self.device, channel="phone_app", call=self.call, started_at=timezone.now(),
            stream_start_ms=0, stream_end_ms=1000, voiced_ms=800, quality=0.9, scope=scope, reason="test",
            disposition="request", transcript=text, transcript_source="device", entry=entry,
        )
        self.last = entry
        self.entries.append(entry)
        return entry

    def owner(self, text: str) -> Any:
        return self._utterance(text, "owner")

    def guest(self, text: str) -> Any:
        return self._utterance(text, "guest")

    def yimi(self, text: str) -> Any:
        from memory.timeline.entries import append_entry

        assert self.last is not None, "Yimi replies to an utterance"
        return append_entry(owner_id=self.device.owner_id, kind="reply", text=text, device_id=self.device.id,
                            scope=self.last.scope, reply_to=self.last)

    def hang_up(self) -> Any:
        from accounts import voice as identity

        identity.end_call(self.call)
        self.call.refresh_from_db()
        return self.call

    def summarize(self) -> Any:
        from companion.topics import summarize_call

        if self.call.ended_at is None:
            self.hang_up()
        return summarize_call(self.call.pk)


def talk(device: Any, call_id: str, turns: list[tuple[str, str]]) -> TranscribedCall:
    """A whole call from (speaker, text) pairs — ``owner``, ``guest`` or ``yimi`` — hung up
    and summarized."""
    call = TranscribedCall(device, call_id)
    for speaker, text in turns:
        getattr(call, speaker)(text)
    outcome = call.summarize()
    assert outcome.status == "written", outcome
    return call


def states(owner_id: int) -> dict[str, tuple[str, str]]:
    """Each topic's current (state, quote)."""
    from companion.topics import current_states

    return {key: (row.state, row.quote) for key, row in current_states(owner_id).items()}
