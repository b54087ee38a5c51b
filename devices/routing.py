from django.urls import path

from devices.consumers import DeviceConsumer
from devices.voice_consumer import VoiceConsumer

websocket_urlpatterns = [
    path("ws/device/", DeviceConsumer.as_asgi()),
    path("ws/voice/", VoiceConsumer.as_asgi()),
]
