"""Internal routes of the timeline erasure, included under ``internal/erasure/``."""

from django.urls import path

from memory.timeline import erasure_views as v

urlpatterns = [
    path("preview/", v.PreviewView.as_view()),
    path("erase/", v.EraseView.as_view()),
    path("result/", v.ResultView.as_view()),
]
