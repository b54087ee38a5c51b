from __future__ import annotations

from django.urls import path

from devices.mac.internal import mac_op

urlpatterns = [path("op/", mac_op)]
