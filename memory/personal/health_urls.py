"""Internal routes of the ``health`` pack, included under ``internal/health/``."""

from django.urls import path

from memory.personal import health_views as v

urlpatterns = [
    path("read/", v.ReadView.as_view()),
]
