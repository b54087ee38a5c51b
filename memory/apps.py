from django.apps import AppConfig


class MemoryConfig(AppConfig):
    name = "memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from memory import checks, copies  # noqa: F401 (checks registers itself)
        from memory.archive import cold_store
        from memory.personal import ambient

        copies.register("memory", ambient.redact_payload, models=("memory.AmbientRecord",))  # forgetting redacts the ambient log's copies too
        cold_store.register_if_configured()  # cold packs: the hot store's reclaimer, cold reader, verifier and eraser
