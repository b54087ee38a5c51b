"""Internal routes of the brain app, included under ``internal/`` (loopback + token)."""

from django.urls import path

from brain.internal_views import CancelReminderView, RemindersView

urlpatterns = [
    path("reminders/", RemindersView.as_view()),
    path("reminders/<uuid:pk>/cancel/", CancelReminderView.as_view()),
]
