"""The websocket consumers, one module per frame family (docs/protocol.md, docs/voice.md).

``connection``: the socket's state machine (challenge, ``auth``, ready), the one frame
parser (``parse_frame``), the per-frame dispatch, errors and close codes. The families:
``timeline`` (``text``, ``ack``, ``sync``, replies and ``timeline.new``), ``cards``
(consent, release and payment answers, unlock, ride permission), ``gestures`` (the glasses'
``gesture`` and ``device.state``), ``model_settings`` (``model.*``), ``captures``
(``image``, ``location.report``, ``health.record``), ``mac`` (the Mac relay).
``device.DeviceConsumer`` (``/ws/device/``) is all of them, with the dispatch table;
``voice.VoiceConsumer`` (``/ws/voice/``) is the device socket plus audio and the voice
session's frames. ``devices/routing.py`` routes both.
"""
