from django.apps import AppConfig

from memory import copies


class CapabilitiesConfig(AppConfig):
    name = "capabilities"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from capabilities.services import redact_payload

        copies.register("capabilities", redact_payload, models=("capabilities.ToolCall", "capabilities.ReceiptRecord"))  # forgetting redacts the copies in this app's tables
