"""The devices that may sign a local-model switch, for the model authority.

``llm.model_settings`` switches models on the strength of a device signature, but brain
sits below devices and never imports it: this directory is registered there when Django
starts (``DevicesConfig.ready``) and answers who a switch's device is and whether its
key signed the switch (``signatures.verify``).
"""

from __future__ import annotations

import functools

from devices import signatures
from devices.models import Device
from llm.model_settings import SwitchSigner
from yimi_project.ids import uuid_or_nil


def _signer(device: Device) -> SwitchSigner:
    return SwitchSigner(
        id=str(device.id), name=device.name, owner_id=device.owner_id, is_guest=device.is_guest,
        verify=functools.partial(signatures.verify, device.public_key),
    )


class DeviceSwitchSigners:
    def active(self, device_id: str) -> SwitchSigner | None:
        device = Device.objects.filter(id=uuid_or_nil(device_id), revoked_at=None).first()
        return _signer(device) if device is not None else None

    def of_owner(self, owner_id: int) -> list[SwitchSigner]:
        devices = Device.objects.filter(owner_id=owner_id, revoked_at=None, is_guest=False).order_by("name")
        return [_signer(device) for device in devices]
