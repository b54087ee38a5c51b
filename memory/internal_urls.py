"""Internal routes of the memory app, included under ``internal/memory/`` (loopback + token)."""

from django.urls import path

from memory import internal_views as v

urlpatterns = [
    path("assertions/", v.AssertionsView.as_view()),
    path("assertions/<uuid:pk>/", v.AssertionView.as_view()),
    path("assertions/<uuid:pk>/history/", v.AssertionHistoryView.as_view()),
    path("assertions/<uuid:pk>/forget/", v.ForgetView.as_view()),
    path("speaking-preferences/", v.SpeakingPreferencesView.as_view()),
    path("speaking-preferences/restore/", v.RestorePreferencesView.as_view()),
    path("recall/", v.RecallView.as_view()),
    path("history/search/", v.HistorySearchView.as_view()),
]
