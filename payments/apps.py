from django.apps import AppConfig

from capabilities import authorities


class PaymentsConfig(AppConfig):
    name = "payments"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from payments.services import CHECKOUT_INTENT, PaymentGate

        authorities.register_gate("payments", PaymentGate())  # the gateway asks it about spend calls
        authorities.register_trusted_field("payment_intent_id", CHECKOUT_INTENT)  # a checkout's intent
