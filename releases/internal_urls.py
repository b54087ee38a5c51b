"""Internal routes of the release pack, included under ``internal/releases/``."""

from django.urls import path

from releases import internal_views as v

urlpatterns = [
    path("rollback/", v.RollbackView.as_view()),
    path("status/", v.StatusView.as_view()),
]
