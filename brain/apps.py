from django.apps import AppConfig


class BrainConfig(AppConfig):
    name = "brain"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from brain.agents import redact_payload
        from memory import copies

        copies.register("brain", redact_payload)  # forgetting redacts the copies in this app's tables
