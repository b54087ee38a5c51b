from django.urls import path

from devices.views import PairView

urlpatterns = [path("pair/", PairView.as_view())]
