"""Internal routes of the brain app, included under ``internal/`` (loopback + token)."""

from django.urls import path

from brain.internal_views import ExecutorChatView, ModelDraftsView, ModelSettingsView

urlpatterns = [
    path("model-settings/", ModelSettingsView.as_view()),
    path("model-settings/drafts/", ModelDraftsView.as_view()),
    path("executor/chat/", ExecutorChatView.as_view()),
]
