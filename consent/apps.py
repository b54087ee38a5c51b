from django.apps import AppConfig


class ConsentConfig(AppConfig):
    name = "consent"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from consent.services import redact_payload
        from memory import copies

        copies.register("consent", redact_payload)  # forgetting redacts the copies in this app's tables
