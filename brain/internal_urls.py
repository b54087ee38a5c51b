"""The brain app's routes on the internal listener (``yimi_project/internal.py``: daphne's
Unix socket only), included under ``internal/``: the platform APIs brain answers for packs
(reminders, model settings and drafts, the executor's chat turn, parcels), each view
checking the calling pack's capability (``brain.internal_views``, ``brain.delivery_views``)."""

from django.urls import path

from brain.delivery_views import ParcelsView
from brain.internal_views import CancelReminderView, ExecutorChatView, ModelDraftsView, ModelSettingsView, RemindersView

urlpatterns = [
    path("reminders/", RemindersView.as_view()),
    path("reminders/<uuid:pk>/cancel/", CancelReminderView.as_view()),
    path("model-settings/", ModelSettingsView.as_view()),
    path("model-settings/drafts/", ModelDraftsView.as_view()),
    path("executor/chat/", ExecutorChatView.as_view()),
    path("watches/parcels/", ParcelsView.as_view()),  # the delivery pack (brain/delivery_views.py)
]
