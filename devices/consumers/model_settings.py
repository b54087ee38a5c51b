"""The owner's model choices on the device socket: the local catalog (``model.catalog``) and
a signed switch (``model.switch``), the model-role drafts (``model.drafts``) and a signed
confirmation (``model.draft.confirm``). The rules are brain's (``llm.model_settings``,
``llm.role_drafts``).
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from accounts.services import is_owner_device
from devices.consumers.connection import DeviceConnection
from llm import catalog, model_settings, role_drafts
from yimi_project.errors import YimiError


class ModelSettingsFrames(DeviceConnection):
    async def _on_model_catalog(self, frame: dict[str, Any]) -> None:
        """The local models a device may switch to, with the digests a switch signs."""

        def listing() -> list[dict[str, Any]]:
            rows = []
            for entry in catalog.load_catalog().entries:
                row = model_settings.selection(entry.kind)
                rows.append({
                    "kind": entry.kind, "model_id": entry.id, "version": entry.version,
                    "digest_summary": entry.digest_summary, "selected": row.selected_key == entry.key,
                    "effective": row.effective_key == entry.key, "state": row.state,
                })
            return rows

        assert self.device is not None
        if self.device.is_guest:
            raise YimiError("forbidden", "a guest device cannot see or switch the owner's models")
        await self._send({"type": "model.catalog", "id": frame.get("id"), "models": await database_sync_to_async(listing)()})

    async def _on_model_switch(self, frame: dict[str, Any]) -> None:
        """A switch signed on this device (``llm.model_settings.model_switch_message``)."""
        assert self.device is not None
        payload = {**frame, "device_id": str(self.device.id)}
        row = await database_sync_to_async(lambda: model_settings.switch_model(model_settings.SignedSwitch.from_payload(payload)))()
        await self._send({
            "type": "model.switch.ok", "id": frame.get("id"), "kind": row.kind, "state": row.state,
            "selected": row.selected_key, "effective": row.effective_key, "previous": row.previous_key,
        })

    async def _on_model_drafts(self, frame: dict[str, Any]) -> None:
        """The model-role drafts a device may confirm (open and probed), with their digests."""
        assert self.device is not None
        if not await database_sync_to_async(is_owner_device)(self.device):
            raise YimiError("forbidden", "only the owner's own (non-guest) devices see or confirm the model drafts")
        drafts = await database_sync_to_async(lambda: [role_drafts.serialize_draft(d) for d in role_drafts.offered_drafts()])()
        await self._send({"type": "model.drafts", "id": frame.get("id"), "drafts": drafts})

    async def _on_model_draft_confirm(self, frame: dict[str, Any]) -> None:
        """A draft confirmed on this device (``llm.role_drafts.draft_confirm_message``)."""
        assert self.device is not None
        payload = {**frame, "device_id": str(self.device.id)}
        draft = await database_sync_to_async(lambda: role_drafts.confirm_draft(role_drafts.SignedDraftConfirm.from_payload(payload)))()
        await self._send({
            "type": "model.draft.confirm.ok", "id": frame.get("id"), "draft_id": str(draft.id), "role": draft.role,
            "state": draft.state, "version": draft.applied_version,
        })
