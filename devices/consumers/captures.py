"""What a device captured, on the device socket: an uploaded ``image`` announced
(devices/images.py), a signed ``location.report`` (memory.location, then the geofences) and
a ``health.record`` (memory.health).
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from devices import images as device_images
from devices.consumers.connection import DeviceConnection
from memory.archive import raw_store
from memory.personal import health, location
from schedules import geofences
from yimi_project import push


class CaptureFrames(DeviceConnection):
    async def _on_image(self, frame: dict[str, Any]) -> None:
        """An uploaded image announced (devices/images.py): on the timeline, analyzed."""
        assert self.device is not None
        device = self.device
        attached = await database_sync_to_async(device_images.attach_from_frame)(device, frame)
        image = attached.image
        await self._send({
            "type": "image.ack", "id": frame.get("id"), "image_id": str(image.id), "seq": attached.entry.seq,
            "duplicate": attached.duplicate,
        })
        if not attached.duplicate:
            await push.to_owner(device.owner_id, push.timeline_new(attached.entry.seq, known_to_socket=self.channel_name))

    async def _on_location_report(self, frame: dict[str, Any]) -> None:
        """A signed location report from the owner's phone (memory.location), then the
        owner's geofences (brain.geofences): ``location.report.ok``."""
        assert self.device is not None
        device, nonce = self.device, self.nonce

        def accept() -> tuple[Any, int, dict[str, Any] | None]:
            stored = location.record_report(device, nonce, frame)
            notices = [] if stored.duplicate else geofences.on_location_report(stored.report)
            at = stored.report.at
            kept = None if stored.duplicate else raw_store.archive_event(raw_store.device_capture(device), "location.report", frame, started_at=at, ended_at=at)
            return stored, len(notices), kept

        stored, notices, kept = await database_sync_to_async(accept)()
        await self._send({
            "type": "location.report.ok", "id": frame.get("id"), "report_id": str(stored.report.id),
            "duplicate": stored.duplicate, "geofence_notices": notices, **(kept or {}),
        })

    async def _on_health_record(self, frame: dict[str, Any]) -> None:
        """A health record from the owner's watch or phone (memory.health): ``health.record.ok``."""
        assert self.device is not None
        device = self.device

        def accept() -> tuple[Any, dict[str, Any] | None]:
            stored = health.record(device, frame)
            row = stored.record
            kept = None if stored.duplicate else raw_store.archive_event(raw_store.device_capture(device), "health.record", frame, started_at=row.start, ended_at=row.end)
            return stored, kept

        stored, kept = await database_sync_to_async(accept)()
        await self._send({
            "type": "health.record.ok", "id": frame.get("id"), "record_id": str(stored.record.id), "duplicate": stored.duplicate,
            **(kept or {}),
        })

    # Frames whose handler re-checks the device itself, in the database trip it makes anyway.
