from __future__ import annotations

from django.urls import path

from devices.home import home

urlpatterns = [path("", home, name="home")]
