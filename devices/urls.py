from django.urls import path

from devices.images import ImageUploadView
from devices.views import PairView

urlpatterns = [path("pair/", PairView.as_view()), path("images/", ImageUploadView.as_view())]
