from django.urls import path

from memory import views

urlpatterns = [
    path("timeline/", views.TimelineView.as_view()),
    path("memory/assertions/", views.AssertionsView.as_view()),
    path("memory/assertions/<uuid:pk>/", views.AssertionView.as_view()),
    path("memory/assertions/<uuid:pk>/history/", views.AssertionHistoryView.as_view()),
    path("memory/assertions/<uuid:pk>/forget/", views.ForgetView.as_view()),
    path("memory/speaking-preferences/", views.SpeakingPreferencesView.as_view()),
    path("memory/speaking-preferences/restore/", views.RestorePreferencesView.as_view()),
    path("memory/recall/", views.RecallView.as_view()),
    path("memory/short-context/", views.ShortContextView.as_view()),
]
