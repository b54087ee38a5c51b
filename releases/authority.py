"""The release authority's gate in the gateway (``self_change``; docs/architecture.md, "Rules":
the release authority's, asking only when the protected baseline is touched).

A ``self_change`` call changes Yimi herself; today the one such tool is the release pack's
``rollback`` (queue the owner's request to go back to the previous version,
``releases.requested``). The gate allows it only when the owner asked for it, in the
owner's own scope, outside scheduled tasks; anything else is blocked, never carded. A
candidate that touches the protected baseline is asked about with its own card
(``releases.baseline``), not through this gate. Registered by ``ReleasesConfig.ready``.
"""

from __future__ import annotations

from typing import Any

from capabilities.authorities import GateQuestion, Verdict


class ReleaseGate:
    """``capabilities.authorities.Gate`` for ``self_change``."""

    waiting_summary = "waiting for the owner; not executed"

    def decide(self, question: GateQuestion) -> Verdict:
        """Steps: 1. only the owner's own scope (a guest, care or unverified speaker never
        changes Yimi); 2. not inside a scheduled task; 3. only at the owner's request;
        4. allowed."""
        if question.binding.scope != "owner":
            return Verdict("block", "forbidden", "only the owner can change Yimi herself; not executed")
        if question.binding.origin == "scheduled":
            return Verdict("block", "not_in_scheduled_task", "a scheduled task does not change Yimi herself; not executed")
        if not question.owner_requested:
            return Verdict("block", "owner_request_required", "Yimi changes herself only when the owner asks; not executed")
        return Verdict("allow", "owner_requested", "the owner asked for this")

    def ask(self, call: Any, question: GateQuestion, verdict: Verdict, *, preview: str, arguments_digest: str) -> str:
        raise RuntimeError("the release gate never asks through the gateway (decide never answers ask)")

    def executing(self, call_id: Any) -> bool:
        return False
