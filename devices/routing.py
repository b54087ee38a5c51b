from django.urls import path

from devices.consumers import DeviceConsumer

websocket_urlpatterns = [path("ws/device/", DeviceConsumer.as_asgi())]
