"""The capability gateway: ``decide``, ``receipt`` and ``observe`` (F2).

The only code that writes ``ToolCall``, ``ReceiptRecord`` and ``ToldFact``. The same
functions serve the agent loop in-process and the loopback HTTP endpoints.
"""

from __future__ import annotations

import hashlib
import json
import logging
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from capabilities import authorities
from capabilities.authorities import GateQuestion, RunBinding, Verdict
from capabilities.manifest import SEPARATOR, PackSet, ToolDecl, load_packs
from capabilities.models import ReceiptRecord, ToldFact, ToolCall
from capabilities.queries import acknowledge_sql
from capabilities.receipts import needs_check, normalize, unknown_receipt
from memory.copies import ForgottenContent, redacted_text, rows_in_chunks
from memory.locks import lock_owner_calls
from yimi_project import call_capability
from yimi_project.errors import YimiError
from yimi_project.ids import NIL, uuid_or_nil
from yimi_project.infra import statements
from yimi_project.logs import log_event

TRUSTED_FIELDS = (
    "session_id",
    "run_id",
    "call_id",
    "idempotency_key",
    "payment_intent_id",
    "payment_authorization_id",
    "authorized_amount",
)
OWNER_REQUESTED = "owner_requested"
CAPABILITY_GRACE_SECONDS = 30.0  # from decide to the pack receiving the call
# A ``long_running`` tool's call starts a task that outlives the call (the phone pack's
# errand: lease, precheck, a model phase of at most 600 s, cleanup); its capability, which
# the task presents for its model steps, lives this much longer.
LONG_RUNNING_SECONDS = 900.0
PAYMENT_BUDGET = "payment_budget"  # reserved: the owner's own spending limit for this request
# The authority each category's gate belongs to; None means "scope check only".
GATE_AUTHORITY: dict[str, str | None] = {
    "observe": None,
    "workspace": None,
    "owner_data": "consent",
    "send": "consent",
    "account": "consent",
    "delete": "consent",
    "physical": "consent",
    "spend": "payments",
    "self_change": "releases",
}


def canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class CallRequest:
    run_id: str
    tool: str
    arguments: Any
    agent_id: str = ""
    # Set by the executor (never the model) when the tool's pack host cannot run it now
    # (``HostManager.unavailable``): why; the call is then refused with ``pack_unavailable``.
    pack_unavailable: str = ""

    @classmethod
    def from_payload(cls, data: Any) -> CallRequest:
        if not isinstance(data, dict) or not isinstance(data.get("run_id"), str) or not isinstance(data.get("tool"), str):
            raise YimiError("invalid_request", "decide needs run_id, tool and arguments")
        return cls(
            data["run_id"], data["tool"], data.get("arguments", {}), str(data.get("agent_id", ""))[:64],
            str(data.get("pack_unavailable") or "")[:300],
        )


@dataclass
class Decision:
    decision: str
    code: str
    reason: str
    call_id: str | None = None
    category: str | None = None
    arguments: dict[str, Any] | None = None  # what to execute, for allow and rewrite
    overridden: list[str] = field(default_factory=list)
    card_id: str | None = None  # for ask: the consent card the owner will answer
    # For an executing call: what the pack may do on the platform during it, and what the
    # executor presents to record its receipt (yimi_project.call_capability). Never shown
    # to the model.
    pack_capability: str | None = None
    receipt_capability: str | None = None

    @property
    def executes(self) -> bool:
        return self.decision in (ToolCall.Decision.ALLOW, ToolCall.Decision.REWRITE)

    def payload(self) -> dict[str, Any]:
        return asdict(self)


def _blocked(code: str, reason: str, **extra: Any) -> Decision:
    return Decision(ToolCall.Decision.BLOCK, code, reason, **extra)


def decide(request: CallRequest) -> Decision:
    """Decide one capability call.

    Steps: 1. bind the call to its run through the admission record (brain's binder,
    ``authorities.bind_run``; no run, or an ended run: block); 2. take the reserved ``owner_requested`` out of the arguments
    and drop any model-supplied trusted field; 3. scope: the pack must list the run's
    scope, and a pack whose host cannot run (the executor says why) is ``pack_unavailable``;
    4. duplicates and unknowns: a ``retry=forbidden`` call whose fingerprint
    already succeeded is blocked (``already_succeeded``), and so is one whose identical
    call is running now (``already_running``); one whose last result is unknown/partial
    and needs a check is blocked until the ``check_with`` tool ran; 5. category: resolve
    ``effect``/``effect_by_arg`` (unresolvable: block, no default); 6. gate: observe and
    workspace go ahead; the other categories go to the gate their authority registered
    (``capabilities.authorities``): owner_data, send, account, delete and physical to the
    consent authority (allow, ``ask`` with a card, or block; the same action already
    waiting for a card is ``already_waiting``), spend to the payment authority (a payment
    whose authorization is already waiting is ``already_waiting`` too), and self_change to
    the release authority (``releases.authority.ReleaseGate``); a category whose authority
    registered no gate is blocked with ``<authority>_authority_missing``.
    Allowed calls get the trusted fields the tool declared in ``context_inject`` (an
    authority fills in its own, such as the payment intent); if that changed the arguments
    the result is ``rewrite``. Every decision on a bound run
    is recorded; a block also writes a ``rejected`` receipt, which only the gateway may
    write.

    Steps 4 to 6 and the recorded call (with its card, payment authorization and
    receipt) are one transaction under the owner's gateway lock
    (``memory.locks.lock_owner_calls``). Of two identical calls decided at once, the
    second therefore sees the first as recorded: it loses the race at step 4
    (``already_running``) or step 6 (``already_waiting``), never runs or asks twice.
    """
    binding = authorities.bind_run(request.run_id)
    if binding is None:
        return _blocked("no_run", "this call is not bound to any run")
    if not binding.active:
        return _blocked("run_ended", "the run this call belongs to has ended")
    if not isinstance(request.arguments, dict):
        return _record(binding, request, {}, False, _blocked("invalid_arguments", "arguments must be a JSON object"), None)

    model_args = dict(request.arguments)
    owner_requested = model_args.pop(OWNER_REQUESTED, False) is True
    budget = model_args.pop(PAYMENT_BUDGET, None)
    overridden = [f for f in TRUSTED_FIELDS if f in model_args]
    for name in overridden:
        model_args.pop(name)

    packs = load_packs()
    tool = packs.tool(request.tool)
    if tool is None:
        return _record(binding, request, model_args, owner_requested, _blocked("unknown_tool", f"there is no tool {request.tool!r}"), None)
    pack = packs.packs[tool.pack]
    if binding.scope not in pack.scopes:
        decision = _blocked("scope", f"{request.tool} is not available in scope {binding.scope}")
        return _record(binding, request, model_args, owner_requested, decision, tool)
    if request.pack_unavailable:
        # Refused before anything is recorded as executing: nothing ran, so its target is
        # not held (an allowed call that never reached its pack would end ``unknown``).
        decision = _blocked("pack_unavailable", f"{request.tool} cannot run now: {request.pack_unavailable}")
        return _record(binding, request, model_args, owner_requested, decision, tool)

    fingerprint = sha256(canonical({"tool": request.tool, "args": model_args}))
    if not _serialized(tool, model_args):
        # Nothing below reads a row that deciding this call writes: no lock, no
        # transaction, one INSERT in autocommit (docs/decisions/2026-12-03-query-budgets.md).
        return _gate(binding, request, tool, model_args, owner_requested, overridden, budget, fingerprint, packs)
    with transaction.atomic():
        lock_owner_calls(binding.owner_id)
        return _gate(binding, request, tool, model_args, owner_requested, overridden, budget, fingerprint, packs)


def _serialized(tool: ToolDecl, model_args: dict[str, Any]) -> bool:
    """Whether steps 4 to 6 must run under the owner's gateway lock: only when one of
    them reads what deciding a call writes, so that two identical calls decided at once
    cannot both pass it — the in-flight check of a ``retry=forbidden`` tool (the allowed
    ``ToolCall`` rows), a gate (its own cards or authorizations: ``already_waiting``), or
    a trusted field an authority fills in (it may open a row of its own). Any other call
    (a read or a workspace call that may be repeated) is checked against rows that
    deciding never writes, so the lock would order nothing; it is decided and recorded
    with one INSERT."""
    if tool.retry == "forbidden":
        return True
    category = tool.resolve_category(model_args)
    if category is None or GATE_AUTHORITY.get(category, "unknown") is not None:
        return True
    return any(name in tool.context_inject for name in authorities.trusted_fields())


def _gate(
    binding: RunBinding, request: CallRequest, tool: ToolDecl, model_args: dict[str, Any], owner_requested: bool,
    overridden: list[str], budget: Any, fingerprint: str, packs: PackSet,
) -> Decision:
    """Steps 4 to 6 of ``decide`` and the recorded call, under the owner's gateway lock
    where ``_serialized`` says one is needed."""
    repeat = _duplicate_or_unchecked(binding.owner_id, fingerprint, tool, model_args)
    if repeat is not None:
        return _record(binding, request, model_args, owner_requested, repeat, tool, fingerprint)

    category = tool.resolve_category(model_args)
    if category is None:
        decision = _blocked("category_unresolved", f"{request.tool}: the arguments map to no effect category; nothing is guessed")
        return _record(binding, request, model_args, owner_requested, decision, tool, fingerprint)
    allowed = authorities.agent_categories(request.agent_id)
    if allowed is not None and category not in allowed:
        decision = _blocked("agent_read_only", f"this agent may only use {', '.join(sorted(allowed))} tools; not executed", category=category)
        return _record(binding, request, model_args, owner_requested, decision, tool, fingerprint)

    authority = GATE_AUTHORITY[category]
    if authority is None:
        decision = Decision(ToolCall.Decision.ALLOW, "ok", "allowed", category=category, overridden=overridden)
        return _record(binding, request, model_args, owner_requested, decision, tool, fingerprint, budget=budget, packs=packs)
    gate = authorities.gate(authority)
    if gate is None:
        decision = _blocked(
            f"{authority}_authority_missing",
            f"{category} actions need the {authority} authority, which this platform version does not have yet; not executed",
            category=category,
        )
        return _record(binding, request, model_args, owner_requested, decision, tool, fingerprint)
    question = GateQuestion(
        binding=binding, category=category, tool=request.tool, target=tool.target_of(model_args),
        task_type=tool.task_type, owner_requested=owner_requested, fingerprint=fingerprint,
    )
    verdict = gate.decide(question)
    if verdict.kind == "block":
        decision = _blocked(verdict.code, verdict.reason, category=category)
    elif verdict.kind == "ask":
        decision = Decision(ToolCall.Decision.ASK, verdict.code, verdict.reason, category=category, overridden=overridden)
    else:
        decision = Decision(ToolCall.Decision.ALLOW, verdict.code, verdict.reason, category=category, overridden=overridden)
    return _record(
        binding, request, model_args, owner_requested, decision, tool, fingerprint, _Asking(gate, question, verdict), packs=packs
    )


@dataclass(frozen=True)
class _Asking:
    """The gate a call goes to if its decision is ``ask``, and what it decided."""

    gate: authorities.Gate
    question: GateQuestion
    verdict: Verdict


def _duplicate_or_unchecked(owner_id: int, fingerprint: str, tool: ToolDecl, model_args: dict[str, Any]) -> Decision | None:
    """Step 4 of ``decide``: for a ``retry=forbidden`` tool, the same call (by
    fingerprint: tool and every argument) already succeeded (``already_succeeded``) or is
    running now (``already_running``: see ``_running``); for any tool, the target is held
    after an unknown (``_unchecked_target``). A ``spend`` call is not matched by
    fingerprint: its arguments do not name the payment (the intent and authorization are
    injected), so every payment would look like the first one; the payment authority
    pays each one-shot authorization once instead."""
    if tool.retry == "forbidden" and tool.resolve_category(model_args) != "spend":
        last = (
            ReceiptRecord.objects.filter(owner_id=owner_id, call_fingerprint=fingerprint, written_by_gateway=False)
            .only("status", "created_at")
            .order_by("-created_at")
            .first()
        )
        if last is not None and last.status == "succeeded":
            return _blocked("already_succeeded", "this already succeeded; it must not be done again")
        if _running(owner_id, fingerprint):
            return _blocked("already_running", "this exact action is running now and must not be done twice; wait for its result")
    return _unchecked_target(owner_id, tool, model_args)


def _running(owner_id: int, fingerprint: str) -> bool:
    """The same call was allowed within its execution time (the lifetime of its pack
    capability: the pack call timeout plus the time to reach the pack) and has no result
    yet. After that time a call without a result no longer holds the action: its pack can
    no longer act for it."""
    since = timezone.now() - timedelta(seconds=float(settings.PACK_CALL_TIMEOUT_SECONDS) + CAPABILITY_GRACE_SECONDS)
    result = ReceiptRecord.objects.filter(call_id=OuterRef("pk"))
    return (
        ToolCall.objects.filter(
            owner_id=owner_id, fingerprint=fingerprint, created_at__gte=since,
            decision__in=(ToolCall.Decision.ALLOW, ToolCall.Decision.REWRITE),
        )
        .exclude(Exists(result))
        .exists()
    )


UNSETTLED = ("unknown", "partial")


def _unchecked_target(owner_id: int, tool: ToolDecl, model_args: dict[str, Any]) -> Decision | None:
    """The unknown-call guard: after an unknown or partial result that needs a check, no
    call of the same tool on the same target runs until the ``check_with`` tool has run.

    Steps: 1. a read (``observe``) is never held: it cannot repeat an effect; 2. the
    call's target is the values of the tool's target arguments (``ToolDecl.target_names``:
    the manifest's ``target``, else the input schema's required arguments, else the tool as
    a whole), so other arguments — an irrelevant one added — do not make a new target;
    3. the newest result of this tool on the same target that needs a check (``unknown``
    or ``partial`` with ``retry=after_check``, the latest revision of its task; a pack's,
    or the gateway's for an interrupted execution), compared on the executed arguments
    without the trusted fields; 4. the call is blocked with ``check_first`` unless a result
    of the check tool (the receipt's ``check_with``, else the manifest's) was recorded
    after it; with no check tool at all it is blocked until the owner decides.
    """
    if tool.resolve_category(model_args) == "observe":
        return None
    target = tool.target_key(model_args)
    later_revision = ReceiptRecord.objects.filter(task_id=OuterRef("task_id"), revision__gt=OuterRef("revision"))
    unsettled = (
        ReceiptRecord.objects.filter(
            owner_id=owner_id, call__tool=tool.full_name, status__in=UNSETTLED, receipt__next__retry="after_check"
        )
        .exclude(Exists(later_revision))
        .order_by("-created_at", "-id")
        .values_list("status", "receipt", "created_at", "call__arguments")
    )
    for status, receipt, created_at, arguments in unsettled:
        executed = {k: v for k, v in (arguments or {}).items() if k not in TRUSTED_FIELDS}
        if tool.target_key(executed) != target or not needs_check(receipt):
            continue
        check_tool = receipt.get("next", {}).get("check_with") or tool.check_with
        if not check_tool:
            return _blocked("check_first", f"the last result on this target is {status} and there is no tool to check it; ask the owner")
        checked = ReceiptRecord.objects.filter(
            owner_id=owner_id,
            call__tool=f"{tool.pack}{SEPARATOR}{check_tool}",
            created_at__gt=created_at,
            written_by_gateway=False,
        ).exists()
        if checked:
            return None
        return _blocked(
            "check_first", f"the last result on this target is {status}; run {tool.pack}{SEPARATOR}{check_tool} to check before trying again"
        )
    return None


def _record(
    binding: RunBinding,
    request: CallRequest,
    model_args: dict[str, Any],
    owner_requested: bool,
    decision: Decision,
    tool: ToolDecl | None,
    fingerprint: str | None = None,
    asking_gate: _Asking | None = None,
    budget: Any = None,
    packs: PackSet | None = None,
) -> Decision:
    fingerprint = fingerprint or sha256(canonical({"tool": request.tool, "args": model_args}))
    # Which published version of the pack the call was decided on: the registry's
    # monitoring compares versions by it (capabilities.registry.monitor).
    decided_on = (packs if packs is not None else load_packs()).packs.get(tool.pack) if tool is not None else None
    call = ToolCall(
        pack_version=decided_on.digest if decided_on is not None else "",
        owner_id=binding.owner_id,
        run_id=binding.run_id,
        agent_id=request.agent_id,
        tool=request.tool[:128],
        category=decision.category or "",
        owner_requested=owner_requested,
        fingerprint=fingerprint,
        idempotency_key=sha256(f"{binding.owner_id}:{fingerprint}")[:32],
        decision=decision.decision,
        decision_code=decision.code,
        decision_reason=decision.reason[:300],
    )
    decision.call_id = str(call.id)
    asking = decision.decision == ToolCall.Decision.ASK
    if (decision.executes or asking) and tool is not None:
        trusted = {
            "session_id": str(binding.admission_id),
            "run_id": str(binding.run_id),
            "call_id": str(call.id),
            "idempotency_key": call.idempotency_key,
        }
        if not asking:
            # Fields an authority fills in, e.g. a checkout's payment intent: only the
            # owner's own request opens one (payments/); without one the executor's
            # CheckoutStop refuses to go further.
            for name, trusted_field in authorities.trusted_fields().items():
                if name in tool.context_inject:
                    trusted[name] = trusted_field.provide(binding, owner_requested, budget)
        final = dict(model_args)
        # Fields only known at execution (a payment authorization) are added then.
        final.update({name: trusted[name] for name in tool.context_inject if name in trusted})
        call.arguments = final  # what runs, now or once the owner approves
        if asking:
            assert asking_gate is not None, "only a gate asks"
            return _ask(call, decision, asking_gate, final)
        decision.arguments = final
        if final != request.arguments:
            decision.decision = ToolCall.Decision.REWRITE
            call.decision = decision.decision
        decision.pack_capability = pack_capability(call, tool, packs=packs)
        decision.receipt_capability = call_capability.mint_receipt(str(call.id))
    if decision.decision != ToolCall.Decision.BLOCK:
        statements.insert(call)  # one INSERT
        return decision
    with transaction.atomic():
        call.save(force_insert=True)
        if decision.decision == ToolCall.Decision.BLOCK:
            receipt = {"receipt_schema": 1, "status": "rejected", "summary": decision.reason, "error": {"code": decision.code}}
            ReceiptRecord.objects.create(
                owner_id=binding.owner_id, call=call, task_id=str(call.id), status="rejected", receipt=receipt,
                call_fingerprint=call.fingerprint,
                content_fingerprint=sha256(canonical(receipt)), written_by_gateway=True,
            )
    return decision


def _ask(call: ToolCall, decision: Decision, asking: _Asking, final: dict[str, Any]) -> Decision:
    """Ask the owner: the call, its ``waiting`` receipt and what the owner answers (the
    gate's: a consent card, or for ``spend`` a payment authorization) commit together; the
    gate sends it to the owner's devices after commit. Nothing is executed now."""
    preview = canonical({k: v for k, v in final.items() if k not in TRUSTED_FIELDS})[:500]
    with transaction.atomic():
        call.save(force_insert=True)
        _store_gateway_receipt(
            call, {"receipt_schema": 1, "status": "waiting", "summary": asking.gate.waiting_summary,
                   "next": {"retry": "forbidden", "waiting_on": "owner"}},
        )
        decision.card_id = asking.gate.ask(
            call, asking.question, asking.verdict, preview=preview, arguments_digest=sha256(canonical(final))
        )
    return decision


def _store_gateway_receipt(call: ToolCall, receipt: dict[str, Any]) -> ReceiptRecord:
    latest = ReceiptRecord.objects.filter(task_id=str(call.id)).order_by("-revision").only("revision").first()
    return ReceiptRecord.objects.create(
        owner_id=call.owner_id, call=call, task_id=str(call.id), revision=(latest.revision + 1) if latest else 1,
        status=receipt["status"], receipt=receipt, content_fingerprint=sha256(canonical(receipt)),
        written_by_gateway=True, call_fingerprint=call.fingerprint,
    )


def record_gateway_receipt(call_id: Any, status: str, summary: str, *, check_first: bool = False) -> ReceiptRecord:
    """A receipt only the gateway writes about a call: ``cancelled`` (denied, expired,
    failed recheck) or ``unknown`` (an interrupted execution), as the call's next revision."""
    call = ToolCall.objects.get(id=uuid_or_nil(call_id))
    receipt: dict[str, Any] = {"receipt_schema": 1, "status": status, "summary": summary}
    if check_first:
        tool = load_packs().tool(call.tool)
        receipt["next"] = {"retry": "after_check", "check_with": tool.check_with if tool else None}
    return _store_gateway_receipt(call, receipt)


def recheck_approved(call_id: Any) -> Decision:
    """Check an approved call again before it runs (the card is the credential): the
    pack and tool still exist and serve the run's scope, the call did not already
    succeed, and its category is still the one the owner approved."""
    call = ToolCall.objects.select_related("run").get(id=uuid_or_nil(call_id))
    packs = load_packs()
    tool = packs.tool(call.tool)
    if tool is None:
        return _blocked("unknown_tool", f"{call.tool} is no longer installed")
    if call.run.scope not in packs.packs[tool.pack].scopes:
        return _blocked("scope", f"{call.tool} is no longer available in scope {call.run.scope}")
    model_args = {k: v for k, v in call.arguments.items() if k not in TRUSTED_FIELDS}
    if tool.resolve_category(model_args) != call.category:
        return _blocked("category_changed", "the tool's category is no longer the one approved")
    last = (
        ReceiptRecord.objects.filter(owner_id=call.owner_id, call_fingerprint=call.fingerprint, written_by_gateway=False)
        .exclude(call_id=call.id)
        .order_by("-created_at")
        .first()
    )
    if last is not None and last.status == "succeeded" and tool.retry == "forbidden":
        return _blocked("already_succeeded", "this already succeeded; it must not be done again")
    return Decision(
        ToolCall.Decision.ALLOW, "approved", "approved by the owner", call_id=str(call.id), category=call.category,
        arguments=call.arguments, pack_capability=pack_capability(call, tool, results_after=_latest_result_row(call)),
        receipt_capability=call_capability.mint_receipt(str(call.id)),
    )


def pack_capability(
    call: ToolCall, tool: ToolDecl, *, now: float | None = None, packs: PackSet | None = None, results_after: int = 0,
) -> str:
    """The capability a pack gets with one call: the call, its run, its owner, pack, tool,
    decided category and target arguments, the platform APIs its pack declared, and whether
    the pack is a version the registry published (``yimi_project.internal.API_PACKS``).

    It is good while the call executes: the call's first result recorded after ledger row
    ``results_after`` ends it (``capability_live``; 0 for a call ``decide`` has just
    recorded, the call's latest row for one executed again: an approved card, a payment
    after a new authorization), and it expires after the call's execution time (plus the
    time to reach the pack; plus ``LONG_RUNNING_SECONDS`` for a ``long_running`` tool, whose
    task outlives the call). The run lets the platform count per run (memory's history
    lookups, at most 3 a run)."""
    pack = (packs if packs is not None else load_packs()).packs[tool.pack]
    claims: dict[str, Any] = {
        "call": str(call.id), "run": str(call.run_id), "owner": call.owner_id, "pack": tool.pack, "tool": call.tool, "category": call.category,
        "target": tool.target_arguments(call.arguments), "apis": pack.platform_api, "results_after": results_after,
    }
    if tool.long_running:
        claims["long_running"] = True
    if pack.digest:
        claims["published"] = True  # a registry version: the APIs made for a shipped pack do not answer it
    ttl = float(settings.PACK_CALL_TIMEOUT_SECONDS) + CAPABILITY_GRACE_SECONDS + (LONG_RUNNING_SECONDS if tool.long_running else 0.0)
    return call_capability.mint(call_capability.PACK, claims, ttl_seconds=ttl, now=now)


def _latest_result_row(call: ToolCall) -> int:
    """The call's newest ledger row (0 for none): a capability minted now for executing the
    call again ends with the first result after it."""
    latest = ReceiptRecord.objects.filter(call=call).order_by("-id").values_list("id", flat=True).first()
    return latest or 0


def execution_capability(call_id: Any) -> str | None:
    """The pack capability for executing an already approved call (a payment with its
    authorization); None when the tool is no longer installed."""
    call = ToolCall.objects.get(id=uuid_or_nil(call_id))
    tool = load_packs().tool(call.tool)
    return pack_capability(call, tool, results_after=_latest_result_row(call)) if tool is not None else None


# Platform APIs a ``long_running`` tool's capability still reaches after its call ended,
# for the task the call started (the phone pack's model steps): none of them holds the
# owner's data. Every other API refuses a capability once its call has a result.
AFTER_CALL_APIS = frozenset({"executor"})


def capability_live(claims: dict[str, Any], api: str) -> bool:
    """Whether the call a verified pack capability names is still executing, so the
    capability may reach the platform API ``api`` (``yimi_project.call_capability.live``,
    registered in ``CapabilitiesConfig.ready``; the signature and expiry are checked first).

    Steps: 1. the call has ended once the ledger holds a result of it newer than the
    capability (a row after ``results_after``): the pack's receipt, a failure, a timeout
    or a cancel, each recorded by the executor the moment the call ends, and the gateway's
    refusal of a receipt naming another task; 2. an ended call's capability is dead at
    once, except that a ``long_running`` tool's still reaches ``AFTER_CALL_APIS`` until it
    expires. A capability minted for no recorded call (``manage.py pack_contract``'s steps)
    has no results and lives until it expires. One indexed query."""
    ended = ReceiptRecord.objects.filter(
        call_id=uuid_or_nil(claims.get("call")), id__gt=_int(claims.get("results_after"))
    ).exists()
    if not ended:
        return True
    return claims.get("long_running") is True and api in AFTER_CALL_APIS


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass
class ReceiptOutcome:
    record: ReceiptRecord
    replayed: bool

    def payload(self) -> dict[str, Any]:
        r = self.record
        return {
            "task_id": r.task_id,
            "call_id": str(r.call_id),
            "revision": r.revision,
            "status": r.status,
            "receipt": r.receipt,
            "violations": r.violations,
            "contradictions": r.contradictions,
            "replayed": self.replayed,
        }


_RECEIPT_CALL_FIELDS = ("id", "owner", "run", "decision", "tool", "category", "fingerprint", "arguments")


def record_receipt(call_id: Any, result: Any, *, transport_error: str | None = None) -> ReceiptOutcome:
    """Validate a tool's result at the trust boundary and store it in the ledger.

    Steps: 1. the call must be one the gateway allowed; 2. ``normalize`` applies the
    schema and the six invariants (only downgrading); 3. the result describes this call
    only: a ``task_id`` other than the call's own must not be another call's id, nor a
    task the ledger holds for another owner, run or pack (``_foreign_task``); otherwise
    nothing is written under that task, the refusal is logged (``receipt_refused``,
    ``foreign_task``) and this call's own result is the gateway's ``unknown`` (check
    first: what the pack did is not known); 4. the record is keyed by (task id, call id,
    revision): a replay with the same content returns the stored record, different
    content is a ``conflict``; 5. a task's revisions strictly increase
    (``stale_revision`` otherwise) and earlier ones are kept as history.
    """
    call = statements.fetch_by_pk(ToolCall, uuid_or_nil(call_id), _RECEIPT_CALL_FIELDS)
    if call is None:
        raise YimiError("unknown_call", "there is no decided call with this id")
    approved = call.decision == ToolCall.Decision.ASK and authorities.approval_in_use(call.id)
    if call.decision not in (ToolCall.Decision.ALLOW, ToolCall.Decision.REWRITE) and not approved:
        raise YimiError("call_not_executed", "this call was not allowed, so it has no tool result")
    tool = load_packs().tool(call.tool)
    normalized = normalize(result, tool=tool, category=call.category or None, transport_error=transport_error)
    receipt = normalized.receipt
    task_id = str(receipt.get("task_id") or call.id)
    revision = int(receipt.get("revision") or 1)
    content_fp = sha256(canonical({"result": result, "transport_error": transport_error}))
    if task_id != str(call.id):
        foreign = _foreign_task(call, task_id)
        if foreign is not None:
            return _refuse_foreign(call, tool, task_id, foreign, content_fp)
    if approved and "task_id" not in receipt:
        # The waiting receipt (and, for a payment, earlier attempts) come first: this is next.
        previous = ReceiptRecord.objects.filter(task_id=task_id).order_by("-revision").first()
        revision = max(revision, (previous.revision + 1) if previous else 1)
    if "task_id" in receipt or revision > 1:
        # A long task reporting a revision: it must be newer than the task's latest.
        latest = ReceiptRecord.objects.filter(task_id=task_id).order_by("-revision").only("call_id", "revision").first()
        if latest is not None and revision <= latest.revision:
            same = ReceiptRecord.objects.filter(task_id=task_id, call=call, revision=revision).first()
            if same is not None:
                return _replay(same, content_fp)
            raise YimiError("stale_revision", f"task {task_id} is already at revision {latest.revision}", latest=latest.revision)
    try:
        # One INSERT; the unique constraints settle replays and races. In autocommit the
        # INSERT is its own transaction; inside a caller's transaction a savepoint keeps
        # that transaction usable when a constraint fires.
        record = ReceiptRecord(
            owner_id=call.owner_id, call=call, task_id=task_id, revision=revision, status=receipt["status"],
            call_fingerprint=call.fingerprint, receipt=receipt, content_fingerprint=content_fp,
            violations=normalized.violations, contradictions=normalized.contradictions,
        )
        with transaction.atomic() if transaction.get_connection().in_atomic_block else nullcontext():
            statements.insert(record)
    except IntegrityError:
        same = ReceiptRecord.objects.filter(task_id=task_id, call=call, revision=revision).first()
        if same is None:
            raise YimiError("stale_revision", f"task {task_id} revision {revision} was recorded by another call") from None
        return _replay(same, content_fp)
    for name, trusted_field in authorities.trusted_fields().items():
        value = call.arguments.get(name)
        if value and trusted_field.on_receipt is not None:
            trusted_field.on_receipt(call, value, receipt)  # e.g. what the checkout page said, for the payment authority
    return ReceiptOutcome(record, replayed=False)


FOREIGN_TASK = "foreign_task"
_FOREIGN = {
    "another_call": "another call's task",
    "another_owner": "a task of another owner",
    "another_run": "a task of another run",
    "another_pack": "a task of another pack",
}


def _foreign_task(call: ToolCall, task_id: str) -> str | None:
    """Why a result of ``call`` may not be stored under ``task_id`` (not the call's own id),
    or None when it may: a long task the same pack reports on within the run that started
    it (a later call's revision, a new task the pack names).

    Refused: 1. the id of another call (a call's own task has its id, whoever owns it);
    2. a task the ledger already holds for another owner, another run or another pack.
    Only a result that names a task of its own pays these queries."""
    key = uuid_or_nil(task_id)
    if key != NIL and ToolCall.objects.filter(id=key).exists():
        return "another_call"
    pack = call.tool.split(SEPARATOR, 1)[0]
    holders = ReceiptRecord.objects.filter(task_id=task_id).values_list("owner_id", "call__run_id", "call__tool").distinct()
    for owner_id, run_id, tool_name in holders:
        if owner_id != call.owner_id:
            return "another_owner"
        if run_id != call.run_id:
            return "another_run"
        if tool_name.split(SEPARATOR, 1)[0] != pack:
            return "another_pack"
    return None


def _refuse_foreign(call: ToolCall, tool: ToolDecl | None, task_id: str, reason: str, content_fp: str) -> ReceiptOutcome:
    """A result that names a task it may not describe: nothing is written under that task.
    The refusal is logged, and this call's own result is the gateway's ``unknown`` (the
    pack's word is worthless, so what it did is not known; check first), which also ends
    the call's pack capability. The same result again is a replay of that record."""
    log_event(
        "receipt_refused", logging.WARNING, code=FOREIGN_TASK, reason=reason, call_id=str(call.id), tool=call.tool,
        task_id=task_id[:128], owner_id=call.owner_id,
    )
    own = str(call.id)
    existing = ReceiptRecord.objects.filter(
        call=call, task_id=own, written_by_gateway=True, content_fingerprint=content_fp
    ).first()
    if existing is not None:
        return ReceiptOutcome(existing, replayed=True)
    receipt = unknown_receipt(f"the pack's result named {_FOREIGN[reason]}, so it was refused", tool)
    receipt["summary"] = "refused: the result described another task than this call's own; what the call did is unknown"
    receipt["error"] = {"code": FOREIGN_TASK}
    latest = ReceiptRecord.objects.filter(task_id=own).order_by("-revision").only("revision").first()
    record = ReceiptRecord.objects.create(
        owner_id=call.owner_id, call=call, task_id=own, revision=(latest.revision + 1) if latest else 1, status="unknown",
        receipt=receipt, call_fingerprint=call.fingerprint, content_fingerprint=content_fp, written_by_gateway=True,
        violations=[f"{FOREIGN_TASK}: the result named {_FOREIGN[reason]} ({task_id[:128]})"],
    )
    return ReceiptOutcome(record, replayed=False)


def _replay(existing: ReceiptRecord, content_fp: str) -> ReceiptOutcome:
    if existing.content_fingerprint != content_fp:
        raise YimiError("conflict", "a different result was already recorded for this call")
    return ReceiptOutcome(existing, replayed=True)


def observe(call_id: Any, *, duration_ms: Any, error: Any = "") -> None:
    """Record how long a call took and its error, if any. Never touches a receipt."""
    if isinstance(duration_ms, bool) or not isinstance(duration_ms, int) or duration_ms < 0:
        raise YimiError("invalid_request", "duration_ms must be a non-negative integer")
    updated = ToolCall.objects.filter(id=uuid_or_nil(call_id)).update(
        duration_ms=duration_ms, observed_error=str(error or "")[:300], observed_at=timezone.now()
    )
    if not updated:
        raise YimiError("unknown_call", "there is no decided call with this id")


def current_receipts(task_ids: list[str]) -> dict[str, ReceiptRecord]:
    """The current projection: the latest revision of each task."""
    latest: dict[str, ReceiptRecord] = {}
    for record in ReceiptRecord.objects.filter(task_id__in=task_ids).order_by("task_id", "revision"):
        latest[record.task_id] = record
    return latest


def delivered_fact_ids(owner_id: int, fact_ids: list[str]) -> set[str]:
    return set(
        ToldFact.objects.filter(owner_id=owner_id, fact_id__in=fact_ids, acknowledged_at__isnull=False).values_list(
            "fact_id", flat=True
        )
    )


def facts_carried(owner_id: int, entry_id: int, fact_ids: list[str]) -> None:
    """Remember which facts a stored reply carries; they count as told after an ACK."""
    ToldFact.objects.bulk_create(
        [ToldFact(owner_id=owner_id, entry_id=entry_id, fact_id=f) for f in fact_ids], ignore_conflicts=True
    )


def acknowledge_entry(entry_id: int) -> int:
    """A device ACKed the reply ``entry_id``: the facts it carried are now told — the ones
    not told before get ``acknowledged_at`` = now. Returns how many. On every ACK, so on
    PostgreSQL its SQL is built once (``capabilities.queries.acknowledge_sql``): the ORM's
    update, values prepared by the fields as the ORM does (``update`` fires no signals;
    ``ToldFact`` has no ``auto_now``); elsewhere (SQLite) that update itself."""
    now = timezone.now()
    if not statements.on_postgresql():
        return ToldFact.objects.filter(entry_id=entry_id, acknowledged_at__isnull=True).update(acknowledged_at=now)
    meta = ToldFact._meta
    with connection.cursor() as cursor:
        cursor.execute(
            acknowledge_sql(),
            [meta.get_field("acknowledged_at").get_db_prep_save(now, connection),  # type: ignore[union-attr]
             meta.get_field("entry").get_db_prep_value(entry_id, connection)],  # type: ignore[union-attr]
        )
        return cursor.rowcount


# --- forgetting --------------------------------------------------------------------------------


def redact_payload(owner_id: int, content: ForgottenContent) -> dict[str, int]:
    """Redact copies of forgotten memory payloads in the owner's ledger. Memory's
    ``forget`` calls this (registered in ``memory.copies``) inside its transaction.

    Steps: 1. every call of the owner, in chunks: its executed arguments, decision reason
    and observed error are redacted (``ForgottenContent``) and written back where something
    changed; 2. the same for every receipt: the normalized receipt, its violations and
    contradictions — the one change a receipt ever gets. Fingerprints and digests stay:
    they hold no text, and the duplicate and unknown guards need them. A card still
    waiting on a redacted call is consent's to withdraw (``consent.services.redact_payload``).
    Returns the rows changed per place.
    """
    calls = receipts = 0
    owned_calls = ToolCall.objects.filter(owner_id=owner_id).only("id", "arguments", "decision_reason", "observed_error")
    for chunk in rows_in_chunks(owned_calls):
        for call in chunk:
            arguments = content.redact(call.arguments)
            reason = redacted_text(content, call.decision_reason, 300)
            error = redacted_text(content, call.observed_error, 300)
            if (arguments, reason, error) != (call.arguments, call.decision_reason, call.observed_error):
                ToolCall.objects.filter(id=call.id).update(arguments=arguments, decision_reason=reason, observed_error=error)
                calls += 1
    owned_receipts = ReceiptRecord.objects.filter(owner_id=owner_id).only("id", "receipt", "violations", "contradictions")
    for chunk in rows_in_chunks(owned_receipts):
        for record in chunk:
            fields = {name: content.redact(getattr(record, name)) for name in ("receipt", "violations", "contradictions")}
            if any(fields[name] != getattr(record, name) for name in fields):
                ReceiptRecord.objects.filter(id=record.id).update(**fields)
                receipts += 1
    return {"tool_calls": calls, "receipts": receipts}
