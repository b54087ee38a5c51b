"""The timeline's frames on the device socket (flow F1 of docs/architecture.md): ``text``
in (``text.ack``), ``reply.chunk`` / ``reply.done`` / ``notice`` / ``timeline.new`` out,
the device's ``ack`` of what it rendered or played, and ``sync`` to catch up.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings

from accounts import devices as device_identity
from accounts.models import Device
from brain.dispatch import dispatch_run, publish_run
from brain.services import accept_utterance, trace_stages_update
from brain.trace import now_ms
from devices import services as device_services
from devices.consumers.connection import DeviceConnection
from memory.timeline import entries as timeline
from yimi_project import push
from yimi_project.errors import YimiError

# How many sent, un-ACKed reply.done frames a socket remembers for their runs' traces.
DONE_SENT_KEPT = 32


class TimelineFrames(DeviceConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # reply.done frames sent and not yet ACKed: seq -> (run id, when sent), for the trace.
        # With whether an ACK of it has ledgers to close (``acknowledge``'s ``ledgers``).
        self._done_sent: dict[int, tuple[str, float, bool]] = {}

    async def _on_text(self, frame: dict[str, Any]) -> None:
        client_id, text = frame.get("id"), frame.get("text")
        if not isinstance(client_id, str) or not 1 <= len(client_id) <= 64:
            raise YimiError("invalid_frame", "text frames need an id of 1 to 64 characters")
        if not isinstance(text, str) or not text.strip():
            raise YimiError("invalid_frame", "text must be a non-empty string")
        if len(text) > settings.WS_MAX_TEXT_CHARS:
            raise YimiError("text_too_long", f"text is limited to {settings.WS_MAX_TEXT_CHARS} characters")
        assert self.device is not None
        thinking = frame.get("thinking") if isinstance(frame.get("thinking"), bool) else None
        device_id, received_ms = self.device.id, self._received_ms

        def admit() -> tuple[Device, Any, bool]:
            """One trip to this socket's database thread: the device re-check (with its
            owner's account, which admission reads), admission + timeline entry + run in
            one transaction, and after commit the run's Celery message (``publish_run``)."""
            device = device_identity.active_device(device_id)
            accepted = accept_utterance(device, client_id, text, thinking=thinking, received_ms=received_ms)
            return device, accepted, (not accepted.duplicate and publish_run(accepted.run_id))

        self.device, accepted, published = await database_sync_to_async(admit)()
        await self._send(
            {
                "type": "text.ack",
                "id": client_id,
                "seq": accepted.entry.seq,
                "run_id": str(accepted.run_id) if accepted.run_id else None,
                "duplicate": accepted.duplicate,
            }
        )
        if not accepted.duplicate:
            if not published:  # the embedded default: the run starts on this event loop
                await dispatch_run(accepted.run_id)
            await push.to_owner(self.device.owner_id, push.timeline_new(accepted.entry.seq, known_to_socket=self.channel_name))

    async def _on_ack(self, frame: dict[str, Any]) -> None:
        """Record the ACK; the first ACK of a ``reply.done`` this socket sent also closes that
        run's trace (``done_sent`` and ``ack``, one UPDATE, in the same thread hop)."""
        assert self.device is not None
        device_id, seq, acked_at = self.device.id, frame.get("seq"), self._received_ms
        sent = self._done_sent.get(seq) if isinstance(seq, int) and not isinstance(seq, bool) else None

        def ack() -> Device:
            """One trip to this socket's database thread: the device re-check, the ACK and the
            trace's stamp (on PostgreSQL one statement: ``acknowledge``)."""
            rider = trace_stages_update(sent[0], {"done_sent": sent[1], "ack": acked_at}) if sent is not None else None
            return device_services.acknowledge(
                device_id, seq, frame.get("status"), ledgers=sent[2] if sent is not None else True, rider=rider
            )

        self.device = await database_sync_to_async(ack)()
        if sent is not None:
            self._done_sent.pop(seq, None)

    async def _on_sync(self, frame: dict[str, Any]) -> None:
        after, limit = frame.get("after", 0), frame.get("limit", 50)
        if isinstance(after, bool) or isinstance(limit, bool) or not isinstance(after, int) or not isinstance(limit, int):
            raise YimiError("invalid_frame", "after and limit must be integers")
        assert self.device is not None
        device = self.device
        page = await database_sync_to_async(timeline.page_after)(
            owner_id=device.owner_id,
            after=after,
            limit=min(limit, settings.TIMELINE_PAGE_MAX),
            only_device_id=device.id if device.is_guest else None,
        )
        entries = await database_sync_to_async(lambda: [timeline.serialize_entry(e) for e in page.entries])()
        await self._send(
            {
                "type": "sync.page",
                "id": frame.get("id"),
                "after": page.after,
                "entries": entries,
                "next_after": page.next_after,
                "has_more": page.has_more,
            }
        )

    # --- messages from the channel layer ------------------------------------------------

    async def reply_chunk(self, event: dict[str, Any]) -> None:
        await self._send(dict(event))

    async def reply_done(self, event: dict[str, Any]) -> None:
        frame = dict(event)
        ledgers = frame.pop("ledgers", True) is not False  # the sender's word, not the device's
        await self._send(frame)
        # The trace's done_sent, kept until the device ACKs (written with the ack; brain.trace).
        if isinstance(event.get("seq"), int) and event.get("run_id"):
            self._done_sent[event["seq"]] = (event["run_id"], now_ms(), ledgers)
            while len(self._done_sent) > DONE_SENT_KEPT:
                self._done_sent.pop(next(iter(self._done_sent)))

    async def notice(self, event: dict[str, Any]) -> None:
        await self._send(dict(event))

    async def timeline_new(self, event: dict[str, Any]) -> None:
        """The hint, to owner devices, except where it tells nothing new (``push.timeline_new``):
        the socket whose ack carried the ``seq``, the device whose ``reply.done`` did."""
        if self.device is None or self.device.is_guest:
            return
        if event.get("known_to_socket") == self.channel_name or event.get("known_to_device") == str(self.device.id):
            return
        await self._send({"type": "timeline.new", "seq": event.get("seq")})

    # an operation for this Mac, and the owner's pause, from the Mac relay (devices/mac/relay.py)
