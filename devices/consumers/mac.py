"""The Mac relay on the device socket (devices/mac/relay.py; docs/protocol.md, "The Mac
relay"): ``mac.hello``, ``mac.pause`` and ``mac.result`` in (``mac_relay.on_hello``,
``on_pause``, ``on_result`` in the dispatch table), an operation and the owner's pause out.
"""

from __future__ import annotations

from devices.consumers.connection import DeviceConnection
from devices.mac import relay as mac_relay


class MacFrames(DeviceConnection):
    # an operation for this Mac, and the owner's pause, from the Mac relay (devices/mac/relay.py)
    mac_op = mac_relay.deliver_op
    mac_paused = mac_relay.deliver_paused
