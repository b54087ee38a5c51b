"""Per-call capabilities: what one executing capability call may do, and nothing more.

A capability pack is untrusted code. It never holds an instance-wide credential; instead
the gateway issues two capabilities for each call it lets execute:

- a **pack capability**, handed to the pack with that one call (MCP ``_meta``), which the
  pack presents when it calls back into the platform (``/internal/memory/...``,
  ``/internal/reminders/...``). Its claims name the call, the owner, the pack, the tool,
  the effect category the gateway decided and the call's target arguments; it expires
  when the call's execution time is up. The platform's pack endpoints check that the
  category allows the operation (a forget needs ``delete``, a write ``owner_data``) and
  that the operation is on the call's target.
- a **receipt capability**, which stays with the executor (the platform code that
  called the pack) and is required to record that call's receipt or observation over
  the internal HTTP interface. A pack never sees it, so a pack cannot report on any
  call, its own included.

Both are Django signatures (HMAC-SHA256 under ``SECRET_KEY``, one salt per purpose), so
verifying the signature needs no database and no import from a higher layer; whether the
call is still executing is the one question asked of the gateway (``live``). The clock is
``clock`` (``now`` overrides it per call), so tests control expiry.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.core import signing

PACK = "pack"
RECEIPT = "receipt"
META_KEY = "ai.yimi/call_capability"  # the MCP ``_meta`` key a pack host reads it from
HEADER = "X-Yimi-Call-Capability"  # the header a pack presents it in

clock: Callable[[], float] = time.time  # what "now" is for expiry; tests replace it


def _salt(purpose: str) -> str:
    return f"yimi.call-capability.{purpose}"


def mint(purpose: str, claims: dict[str, Any], *, ttl_seconds: float | None = None, now: float | None = None) -> str:
    body = dict(claims)
    if ttl_seconds is not None:
        body["exp"] = int((clock() if now is None else now) + ttl_seconds) + 1
    return signing.dumps(body, salt=_salt(purpose), compress=True)


def verify(purpose: str, token: Any, *, now: float | None = None) -> dict[str, Any] | None:
    """The claims of a valid, unexpired capability for ``purpose``; None otherwise."""
    if not isinstance(token, str) or not token or len(token) > 4096:
        return None
    try:
        claims = signing.loads(token, salt=_salt(purpose))
    except signing.BadSignature:
        return None
    if not isinstance(claims, dict):
        return None
    exp = claims.get("exp")
    if exp is not None and (clock() if now is None else now) >= exp:
        return None
    return claims


def mint_receipt(call_id: str) -> str:
    return mint(RECEIPT, {"call": str(call_id)})


def receipt_allows(token: Any, call_id: Any) -> bool:
    claims = verify(RECEIPT, token)
    return claims is not None and claims.get("call") == str(call_id)


# Whether the call a pack capability was issued for is still executing: the gateway knows
# (its ledger records when a call ended), and registers the answer when Django starts.
_liveness: Callable[[dict[str, Any], str], bool] | None = None


def register_liveness(check: Callable[[dict[str, Any], str], bool]) -> None:
    """The gateway's answer to "may this capability still reach ``api``?" (capabilities/)."""
    global _liveness
    _liveness = check


def live(claims: dict[str, Any], api: str) -> bool:
    """Whether the call of a verified pack capability is still executing, so the capability
    may reach the platform API ``api``. No registered answer: never (fail closed)."""
    return _liveness is not None and _liveness(claims, api)
