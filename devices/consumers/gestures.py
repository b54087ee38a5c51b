"""The glasses' frames on the device socket (devices/hud.py): a ``gesture`` (nod or shake)
on a card, and ``device.state`` (riding turns gestures off).
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from brain.consent_execution import acknowledge_denied
from brain.dispatch import dispatch_card_execution
from devices import hud
from devices.consumers.connection import DeviceConnection


class GestureFrames(DeviceConnection):
    async def _on_gesture(self, frame: dict[str, Any]) -> None:
        """A nod or a shake from the glasses on a card (devices/hud.py)."""
        assert self.device is not None
        outcome = await database_sync_to_async(hud.answer_gesture)(self.device, frame)
        await self._send({
            "type": "gesture.result", "id": frame.get("id"), "card_kind": outcome.card_kind, "card_id": outcome.card_id,
            "gesture": outcome.gesture, "effect": outcome.effect, "state": outcome.state,
        })
        if outcome.card is not None and outcome.state == "approved":
            await dispatch_card_execution(outcome.card.id)
        elif outcome.card is not None and outcome.state == "denied":
            await acknowledge_denied(outcome.card.id)

    async def _on_device_state(self, frame: dict[str, Any]) -> None:
        """What the device says about itself: ``riding`` turns gestures off (devices/hud.py)."""
        assert self.device is not None
        state = await database_sync_to_async(hud.report_state)(self.device, frame)
        await self._send({"type": "device.state.ok", "id": frame.get("id"), "riding": state.riding})
