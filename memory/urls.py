from django.urls import path

from memory.views import TimelineView

urlpatterns = [path("timeline/", TimelineView.as_view())]
