"""Internal routes of the ``location`` pack, included under ``internal/location/``."""

from django.urls import path

from brain import location_views as v

urlpatterns = [
    path("where/", v.WhereView.as_view()),
    path("places/", v.PlacesView.as_view()),
    path("distance/", v.DistanceView.as_view()),
    path("geofences/", v.GeofencesView.as_view()),
]
