from django.apps import AppConfig


class ConsentConfig(AppConfig):
    name = "consent"
    default_auto_field = "django.db.models.BigAutoField"
