from django.urls import path

from devices.consumers.device import DeviceConsumer
from devices.consumers.voice import VoiceConsumer

websocket_urlpatterns = [
    path("ws/device/", DeviceConsumer.as_asgi()),
    path("ws/voice/", VoiceConsumer.as_asgi()),
]
