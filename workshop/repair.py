"""The repair step: a failed self-test goes back to the build step, with the workshop's model.

``model_repair(spec, failure)`` asks the ``workshop_repair`` model role (``llm.roles``;
it falls back to ``brain`` when not configured) for a corrected spec: the model sees the
spec and the end of the failed attempt's output, and answers one JSON object holding only
the parts it changes (``adapter``, ``fake``, ``contract``, ``skill``, ``tools`` or
``reuse.wrapper``). The name cannot change. The merged spec is validated like any other
(``workshop.drafts.validate_spec``): a reply that is not such an object ends the build
with ``repair_unusable``; an unreachable model ends it with the model's own error code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync

from llm import roles
from llm.client import BrainError, complete
from workshop.drafts import validate_spec
from yimi_project.errors import YimiError

Repair = Callable[[dict[str, Any], str], dict[str, Any]]
REPAIRABLE = ("adapter", "fake", "contract", "skill", "tools")
FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")
INSTRUCTIONS = (
    "You repair a Yimi capability pack built from a build spec. Its self-test (the contract cases "
    "against the fake, in a sandbox without network) failed; the failure is below. Find the cause "
    "and fix it at its source with the smallest change. Every tool returns a receipt built with "
    "capabilities.packkit. Reply with one JSON object and nothing else, holding only the keys you "
    f"change, among: {', '.join(REPAIRABLE)}, and reuse (an object with wrapper). Never change name."
)


def repair_messages(spec: dict[str, Any], failure: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": f"Build spec:\n{json.dumps(spec, ensure_ascii=False, indent=1)}\n\nSelf-test failure:\n{failure}"},
    ]


def merge_reply(spec: dict[str, Any], text: str) -> dict[str, Any]:
    """The spec with the model's changes, validated; ``repair_unusable`` otherwise."""
    try:
        changes = json.loads(FENCE.sub("", text.strip()))
    except ValueError:
        raise YimiError("repair_unusable", "the repair model did not answer with a JSON object") from None
    allowed = {*REPAIRABLE, "reuse"}
    if not isinstance(changes, dict) or not changes or set(changes) - allowed:
        raise YimiError("repair_unusable", f"the repair model's answer must change only {sorted(allowed)}")
    merged = dict(spec)
    for key, value in changes.items():
        if key == "reuse":
            if not isinstance(value, dict) or set(value) != {"wrapper"} or "reuse" not in spec:
                raise YimiError("repair_unusable", "reuse changes only the wrapper of a reuse build")
            merged["reuse"] = {**spec["reuse"], "wrapper": value["wrapper"]}
        else:
            merged[key] = value
    try:
        return validate_spec(merged)
    except YimiError as exc:
        raise YimiError("repair_unusable", f"the repaired spec is not valid: {exc.message}") from None


def model_repair(spec: dict[str, Any], failure: str) -> dict[str, Any]:
    settings_ = roles.resolve("workshop_repair")
    try:
        completion = async_to_sync(complete)(repair_messages(spec, failure), role_settings=settings_)
    except BrainError as exc:
        raise YimiError(exc.code, f"the repair model could not be asked ({exc.detail})") from None
    return merge_reply(spec, completion.text)
