from django.urls import path

from capabilities import views

urlpatterns = [
    path("decide/", views.decide),
    path("receipt/", views.receipt),
    path("observe/", views.observe),
]
