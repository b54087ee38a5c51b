"""Internal route of the owner's profile, included under ``internal/profile/``."""

from django.urls import path

from memory.assertions.profile_views import ProfileView

urlpatterns = [path("", ProfileView.as_view())]
