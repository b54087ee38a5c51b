from django.urls import path

from capabilities.views import DecideView, ObserveView, ReceiptView

urlpatterns = [
    path("decide/", DecideView.as_view()),
    path("receipt/", ReceiptView.as_view()),
    path("observe/", ObserveView.as_view()),
]
