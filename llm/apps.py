"""The ``llm`` app: the model client and everything about which model answers: model roles
and their drafts, provider keys, usage records, the local model catalog and its settings,
the derived vector index, the brain probe and the demo brain.

It sits below ``brain`` (which calls the client) and never imports it: a run's model-role
pin, a column of brain's ``Run``, is read and written through what brain registers
(``llm.roles.register_run_pins``).
"""

from django.apps import AppConfig

from yimi_project import views


class LlmConfig(AppConfig):
    name = "llm"
    verbose_name = "Models"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Here, not at the top: these modules import models, which exist only once the app
        # registry is ready (memory is a layer below; no cycle is being dodged).
        from llm import probe, tasks  # noqa: F401 - tasks: its Celery tasks, started by name (llm.model_settings)
        from llm.vector_index import effective_embedder
        from memory.timeline import embeddings

        embeddings.register_catalog_embedder(effective_embedder)  # recall embeds with the catalog's model
        views.register_health_check("brain", probe.health_check)  # GET /api/health/: the brain role answers
