"""What the gateway asks other authorities, as interfaces capabilities/ defines and they fill
in when Django starts (docs/architecture.md, "Seams").

consent/ and payments/ sit above capabilities/ (they use its ledger and its executor), and
brain/ above them, so ``decide`` never imports any of them. Instead each registers here from
its ``AppConfig.ready``:

- brain/ binds a call to its run (``register_run_binder``; step 1 of ``decide``);
- consent/, payments/ and releases/ register their **gates** (``register_gate``): step 6
  gives a call of a category they own to the gate, which allows it, blocks it or asks the
  owner; asking opens what the owner answers (a card, an authorization) inside the gateway's
  transaction (the release gate never asks);
- brain/ limits what an agent may do (``register_agent_limit``): a read-only self-check
  agent may call only ``observe`` tools, whatever its tool list said;
- payments/ fills in a trusted field (``register_trusted_field``: ``payment_intent_id``)
  and reads the result of the call it was injected into (the checkout's amount).

A category whose authority registered no gate (an app not installed) is blocked with
``<authority>_authority_missing``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # apps import this module before models can be loaded (AppConfig.ready)
    from capabilities.models import ToolCall


@dataclass(frozen=True)
class RunBinding:
    """What the gateway needs to bind a call: the run, its owner, admission and scope."""

    run_id: Any
    owner_id: int
    admission_id: Any
    scope: str
    active: bool
    origin: str = "interactive"


@dataclass(frozen=True)
class GateQuestion:
    """One call at step 6 of ``decide``, as the gateway resolved it."""

    binding: RunBinding
    category: str
    tool: str  # the full name, ``{pack}__{tool}``
    target: str | None  # the values of the tool's target arguments
    task_type: str
    owner_requested: bool
    fingerprint: str


@dataclass(frozen=True)
class Verdict:
    kind: str  # "allow", "ask" or "block"
    code: str
    reason: str
    ticket: Any = None  # what the gate needs again to ask (``Gate.ask``)


class Gate(Protocol):
    """An authority's gate: step 6 of ``decide`` for the categories it owns."""

    waiting_summary: str  # the ``waiting`` receipt's summary while the owner is asked

    def decide(self, question: GateQuestion) -> Verdict:
        """Allow, ask or block; a call already waiting for the owner is ``already_waiting``."""
        ...

    def ask(self, call: ToolCall, question: GateQuestion, verdict: Verdict, *, preview: str, arguments_digest: str) -> str:
        """Inside the gateway's transaction, after the call and its ``waiting`` receipt:
        open what the owner answers and send it after commit. Returns its id."""
        ...

    def executing(self, call_id: Any) -> bool:
        """An approval of this asked call is being used right now, so it may record a result."""
        ...


@dataclass(frozen=True)
class TrustedField:
    """A trusted argument an authority fills in for a tool that declares it in
    ``context_inject``, and what it learns from the result of that call."""

    provide: Callable[[RunBinding, bool, Any], str]  # (binding, owner_requested, budget) → value
    on_receipt: Callable[[ToolCall, str, dict[str, Any]], None] | None = None  # (call, value, receipt)


_run_binder: Callable[[Any], RunBinding | None] | None = None
_gates: dict[str, Gate] = {}
_trusted_fields: dict[str, TrustedField] = {}
_agent_limit: Callable[[str], frozenset[str] | None] | None = None


def register_agent_limit(limit: Callable[[str], frozenset[str] | None]) -> None:
    """brain/ tells the gateway which categories an agent may use (None: no limit)."""
    global _agent_limit
    _agent_limit = limit


def agent_categories(agent_id: str) -> frozenset[str] | None:
    """The only categories the calling agent may use, or None when it is not limited."""
    if not agent_id or _agent_limit is None:
        return None
    return _agent_limit(agent_id)


def register_run_binder(binder: Callable[[Any], RunBinding | None]) -> None:
    global _run_binder
    _run_binder = binder


def register_gate(authority: str, gate: Gate) -> None:
    _gates[authority] = gate


def register_trusted_field(name: str, field: TrustedField) -> None:
    _trusted_fields[name] = field


def bind_run(run_id: Any) -> RunBinding | None:
    """The run a call belongs to, or None when there is no such run."""
    if _run_binder is None:
        raise RuntimeError("no run binder registered: the brain app is not installed")
    return _run_binder(run_id)


def gate(authority: str) -> Gate | None:
    return _gates.get(authority)


def trusted_fields() -> dict[str, TrustedField]:
    return dict(_trusted_fields)


def approval_in_use(call_id: Any) -> bool:
    """An asked call may report a result only while an approval is being used for it: a
    consent card's execution token, or a payment authorization just used."""
    return any(g.executing(call_id) for g in _gates.values())
