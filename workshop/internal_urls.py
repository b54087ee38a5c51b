"""Internal routes of the workshop, included under ``internal/workshop/``."""

from django.urls import path

from workshop.internal_views import WorkshopView

urlpatterns = [path("", WorkshopView.as_view())]
