from django.apps import AppConfig

from capabilities import authorities
from memory import copies


class ConsentConfig(AppConfig):
    name = "consent"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from consent.services import ConsentGate, redact_payload

        copies.register("consent", redact_payload, models=("consent.ConsentCard",))  # forgetting redacts the copies in this app's tables
        authorities.register_gate("consent", ConsentGate())  # the gateway asks it about consent categories
