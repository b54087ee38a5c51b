from django.apps import AppConfig


class BrainConfig(AppConfig):
    name = "brain"
    default_auto_field = "django.db.models.BigAutoField"
