"""Cards on the device socket: the owner's signed answers to consent, release and payment
cards, the unlock lease and ride permissions (flow F3 of docs/architecture.md), and the cards
the channel layer brings (``consent.card``, ``payment.card``, ``release.card``, ``activity``).
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from accounts.models import Device
from brain.consent_execution import acknowledge_denied
from brain.dispatch import dispatch_card_execution, dispatch_payment
from brain.payment_execution import acknowledge_declined
from consent import services as consent
from devices import hud
from devices.consumers.connection import DeviceConnection
from payments import services as payments
from releases import baseline as release_baseline


class CardFrames(DeviceConnection):
    async def _send_pending_cards(self, device: Device) -> None:
        """Cards that were pushed while this device was away, once per connection: open
        consent cards (to phones and glasses) and open payment cards (to phones), each as
        it was first sent."""
        def cards() -> list[dict[str, Any]]:
            if device.is_guest:
                return []
            frames = []
            if device.id in consent.card_devices(device.owner_id):
                frames += [consent.card_frame(c) for c in consent.pending_cards(device.owner_id)]
            if device.id in payments.card_devices(device.owner_id):
                frames += [payments.card_frame(a) for a in payments.pending_cards(device.owner_id)]
            frames += release_baseline.pending_card_frames(device.owner_id, device.id)
            return frames

        for frame in await database_sync_to_async(cards)():
            await self._send(hud.with_hud(device, frame))

    async def _on_consent_answer(self, frame: dict[str, Any]) -> None:
        assert self.device is not None
        card = await database_sync_to_async(consent.answer_card)(
            self.device, frame.get("card_id"), frame.get("answer"), frame.get("signature")
        )
        await self._send({"type": "consent.result", "id": frame.get("id"), "card_id": str(card.id), "state": card.state})
        if card.state == "approved":
            await dispatch_card_execution(card.id)
        elif card.state == "denied":
            await acknowledge_denied(card.id)

    async def _on_release_answer(self, frame: dict[str, Any]) -> None:
        """The owner's answer to a protected-baseline card (releases.baseline)."""
        assert self.device is not None
        card = await database_sync_to_async(release_baseline.answer_card)(
            self.device, frame.get("card_id"), frame.get("answer"), frame.get("signature")
        )
        await self._send({"type": "release.result", "id": frame.get("id"), "card_id": str(card.id), "state": card.state})

    async def _on_payment_answer(self, frame: dict[str, Any]) -> None:
        assert self.device is not None
        auth = await database_sync_to_async(payments.answer_card)(
            self.device, frame.get("authorization_id"), frame.get("answer"), frame.get("signature")
        )
        await self._send({"type": "payment.result", "id": frame.get("id"), "authorization_id": str(auth.id), "state": auth.state})
        if auth.state == "authorized":
            await dispatch_payment(auth.id)
        elif auth.state == "denied":
            await acknowledge_declined(auth.id)

    async def _on_payment_voice_confirm(self, frame: dict[str, Any]) -> None:
        assert self.device is not None
        auth = await database_sync_to_async(payments.voice_confirm)(self.device, frame.get("authorization_id"), frame.get("utterance_seq"))
        await self._send({"type": "payment.result", "id": frame.get("id"), "authorization_id": str(auth.id), "state": auth.state})
        await dispatch_payment(auth.id)

    async def _on_payment_undo(self, frame: dict[str, Any]) -> None:
        assert self.device is not None
        auth = await database_sync_to_async(payments.undo)(self.device, frame.get("authorization_id"), frame.get("signature"))
        await self._send({"type": "payment.result", "id": frame.get("id"), "authorization_id": str(auth.id), "state": auth.state})

    async def _on_unlock(self, frame: dict[str, Any]) -> None:
        assert self.device is not None
        lease = await database_sync_to_async(payments.grant_unlock_lease)(self.device, self.nonce, frame.get("signature"))
        await self._send({"type": "unlock.ok", "id": frame.get("id"), "expires_at": lease.expires_at.isoformat()})

    async def _on_ride_permission(self, frame: dict[str, Any]) -> None:
        assert self.device is not None
        permission = await database_sync_to_async(consent.grant_ride_permission_from_device)(
            self.device, self.nonce, frame.get("minutes"), frame.get("signature")
        )
        await self._send({"type": "ride.permission.ok", "id": frame.get("id"), "expires_at": permission.expires_at.isoformat()})

    # --- messages from the channel layer ------------------------------------------------

    async def consent_card(self, event: dict[str, Any]) -> None:
        await self._send(hud.with_hud(self.device, dict(event)))

    async def payment_card(self, event: dict[str, Any]) -> None:
        await self._send(hud.with_hud(self.device, dict(event)))

    async def release_card(self, event: dict[str, Any]) -> None:
        if self.device is not None and not self.device.is_guest:
            await self._send(dict(event))

    async def activity(self, event: dict[str, Any]) -> None:
        if self.device is not None and not self.device.is_guest:
            await self._send(hud.with_hud(self.device, dict(event)))
