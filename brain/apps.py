from django.apps import AppConfig


class BrainConfig(AppConfig):
    name = "brain"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from brain.agents import redact_payload
        from brain.vector_index import effective_embedder
        from memory import copies, embeddings

        copies.register("brain", redact_payload)  # forgetting redacts the copies in this app's tables
        embeddings.register_catalog_embedder(effective_embedder)  # recall embeds with the catalog's model
