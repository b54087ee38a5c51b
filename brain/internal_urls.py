"""The brain app's routes on the internal listener (``yimi_project/internal.py``: daphne's
Unix socket only), included under ``internal/``: the platform APIs brain answers for packs
(reminders, model settings and drafts, the executor's chat turn, parcels), each view
checking the calling pack's capability (``brain.internal_views``, ``schedules.views``)."""

from django.urls import path

from brain.internal_views import ExecutorChatView, ModelDraftsView, ModelSettingsView

urlpatterns = [
    path("model-settings/", ModelSettingsView.as_view()),
    path("model-settings/drafts/", ModelDraftsView.as_view()),
    path("executor/chat/", ExecutorChatView.as_view()),
]
