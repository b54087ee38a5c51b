from django.apps import AppConfig

from memory import copies
from yimi_project import call_capability


class CapabilitiesConfig(AppConfig):
    name = "capabilities"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from capabilities.services import capability_live, redact_payload

        copies.register("capabilities", redact_payload, models=("capabilities.ToolCall", "capabilities.ReceiptRecord"))  # forgetting redacts the copies in this app's tables
        call_capability.register_liveness(capability_live)  # a pack capability dies when its call ends
