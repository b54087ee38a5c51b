"""Internal routes of the ``schedule``, ``location`` and ``delivery`` packs, included under
``internal/`` (``yimi_project/urls.py``; the views and who may call them: ``schedules/views.py``)."""

from django.urls import path

from schedules import views as v

urlpatterns = [
    path("reminders/", v.RemindersView.as_view()),
    path("reminders/<uuid:pk>/cancel/", v.CancelReminderView.as_view()),
    path("location/where/", v.WhereView.as_view()),
    path("location/places/", v.PlacesView.as_view()),
    path("location/distance/", v.DistanceView.as_view()),
    path("location/geofences/", v.GeofencesView.as_view()),
    path("watches/parcels/", v.ParcelsView.as_view()),  # the delivery pack
]
