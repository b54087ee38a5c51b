"""A run's model-role pin (``Run.model_roles``): which version of each run role
(``llm.roles.RUN_ROLES``) the run's whole tree uses, read and written for
``llm.roles.for_run``, which brain registers them with (``BrainConfig.ready``): the pin is a
column of this app's ``Run``, and llm, a layer below, never imports brain.

Besides ``brain.services`` (the claim writes the pin in its own UPDATE), the only code that
writes ``Run.model_roles``, and only where the run has none yet.
"""

from __future__ import annotations

from typing import Any

from brain.models import Run


def read_pin(run_id: Any) -> Any:
    """The run's pin, or None (no pin yet, or no such run). One query."""
    return Run.objects.filter(id=run_id).values_list("model_roles", flat=True).first()


def write_unset_pin(run_id: Any, wanted: dict[str, Any]) -> bool:
    """Pin the run to ``wanted`` unless it has a pin (one conditional UPDATE,
    ``model_roles IS NULL``); False when another process pinned it first."""
    return Run.objects.filter(id=run_id, model_roles__isnull=True).update(model_roles=wanted) == 1
