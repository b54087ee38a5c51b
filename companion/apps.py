"""The companion app (issue 21; its own app since issue 36): who the voice companion is
(persona versions, ``companion.persona``), the content cards a call may offer
(``companion.content_cards``), what a call starts with (the frozen snapshot,
``companion.snapshot``), what it leaves for the next one (summaries and topic progress,
``companion.topics`` with the rules of ``companion.extractor``, sent at hang-up by
``companion.tasks``), the events of each call and their report (``companion.events``) and
the owner's privacy epoch with the continuity switch (``companion.privacy_epoch``).

It sits below the brain (the brain's runner asks ``companion.snapshot.call_prompt`` for a
call's system prompt) and above memory, which it plugs into when Django starts.
"""

from __future__ import annotations

from django.apps import AppConfig

from memory import copies, source_changes


class CompanionConfig(AppConfig):
    name = "companion"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Here, not at the top: these modules import models, which exist only once the app
        # registry is ready.
        from companion import privacy_epoch, snapshot, topics

        # forgetting redacts the copies in the call snapshots (opening and background)
        copies.register("companion", snapshot.redact_payload, models=("companion.CallSnapshot",))
        source_changes.register("companion", privacy_epoch.on_source_change)  # a forget, edit or erase moves the privacy epoch
        privacy_epoch.register_invalidator("topics", topics.invalidate)  # summaries and topic rows, in the bump's transaction
