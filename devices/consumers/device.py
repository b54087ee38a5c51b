"""``/ws/device/``: the device socket, one class from its frame families.

The connection and its state machine are ``devices.consumers.connection``; each family's
handlers are a module of this package (timeline, cards, gestures, model settings,
captures, the Mac relay). ``HANDLERS`` is the whole per-frame dispatch, in one table.
"""

from __future__ import annotations

from devices.consumers.captures import CaptureFrames
from devices.consumers.cards import CardFrames
from devices.consumers.connection import DeviceConnection
from devices.consumers.gestures import GestureFrames
from devices.consumers.mac import MacFrames
from devices.consumers.model_settings import ModelSettingsFrames
from devices.consumers.timeline import TimelineFrames
from devices.mac import relay as mac_relay


class DeviceConsumer(TimelineFrames, CardFrames, GestureFrames, ModelSettingsFrames, CaptureFrames, MacFrames):
    # Frames whose handler re-checks the device itself, in the database trip it makes anyway.
    RECHECKED_IN_HANDLER = frozenset({"text", "ack"})

    HANDLERS = {
        "text": TimelineFrames._on_text,
        "image": CaptureFrames._on_image,
        "gesture": GestureFrames._on_gesture,
        "device.state": GestureFrames._on_device_state,
        "model.catalog": ModelSettingsFrames._on_model_catalog,
        "model.switch": ModelSettingsFrames._on_model_switch,
        "model.drafts": ModelSettingsFrames._on_model_drafts,
        "model.draft.confirm": ModelSettingsFrames._on_model_draft_confirm,
        "ride.permission": CardFrames._on_ride_permission,
        "ack": TimelineFrames._on_ack,
        "sync": TimelineFrames._on_sync,
        "ping": DeviceConnection._on_ping,
        "consent.answer": CardFrames._on_consent_answer,
        "release.answer": CardFrames._on_release_answer,
        "payment.answer": CardFrames._on_payment_answer,
        "payment.voice_confirm": CardFrames._on_payment_voice_confirm,
        "payment.undo": CardFrames._on_payment_undo,
        "device.unlock": CardFrames._on_unlock,
        # the Mac relay (devices/mac/relay.py)
        "mac.hello": mac_relay.on_hello,
        "mac.pause": mac_relay.on_pause,
        "mac.result": mac_relay.on_result,
        # location and health (memory.location, memory.health)
        "location.report": CaptureFrames._on_location_report,
        "health.record": CaptureFrames._on_health_record,
    }
