"""The deterministic reply checker (``check_reply``): no model call.

``check_reply`` takes the model's reply (content and tone only) and removes every sentence
that disagrees with the receipts or repeats an instruction meant for the model: numbers not in the receipts, status words the receipts do
not back, "will receive"/"has read" without a verified read-back effect, "noted" without a verified owner_data/workspace effect, suggestions to redo a
``retry: forbidden`` call that succeeded, and restatements of facts already delivered; the
owner's own words quoted back are hers, not a claim to check. It then appends, from the templates' owner wording, every undelivered fact the remaining text does not state.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from capabilities.truth.claims import CLAIM_STATUSES, PROOF_CLAIMS, proof_claims, split_sentences, status_claims, suggests_retry
from capabilities.truth.facts import Fact, _is_number
from capabilities.truth.numerals import chinese_to_arabic
from capabilities.truth.quantities import (
    _UNIT_INDEX,
    _loose_numbers,
    _Number,
    _numbers,
    _same,
    canonical_unit,
    units_compatible,
)
from yimi_project.leaks import find_markers, redact_markers


@dataclass
class CheckResult:
    """What ``check_reply`` made of a reply.

    ``text``: the final text; ``removed``: (sentence, reason) pairs; ``added``: facts appended
    from templates; ``told``: ids of the facts the final text carries (stated by kept
    sentences, or added), in the order of the ``facts`` argument.
    """

    text: str
    removed: list[tuple[str, str]] = field(default_factory=list)
    added: list[Fact] = field(default_factory=list)
    told: list[str] = field(default_factory=list)


def _norm(s: str) -> str:
    return re.sub(r"[\W_]+", "", chinese_to_arabic(s)).lower()


@dataclass
class _Evidence:
    values: list[tuple[float, str]]  # numeric receipt values with their unit
    loose: set[float]  # numbers spelled in receipt texts (content, targets, …) and facts
    units: list[str]  # unit spellings to recognize, longest first
    statuses: set[str | None]  # a receipt without a status adds None
    verified_targets: list[str]
    effect_targets: list[str]  # every effect's target
    proven: dict[str, list[str]]  # PROOF_CLAIMS claim → targets of the verified effects that prove it
    noted_ok: bool
    forbidden_done: bool


def _evidence(receipts: list[dict[str, Any]], facts: list[Fact]) -> _Evidence:
    values: list[tuple[float, str]] = []
    texts: list[str] = []
    statuses: set[str | None] = set()
    verified_targets: list[str] = []
    effect_targets: list[str] = []
    proven: dict[str, list[str]] = {claim: [] for claim in PROOF_CLAIMS}
    noted_ok = forbidden_done = False
    for r in receipts:
        status = r.get("status")
        statuses.add(status)
        for item in r.get("values") or []:
            if _is_number(item.get("value")):
                if item.get("unit"):
                    values.append((float(item["value"]), str(item["unit"])))
            else:
                texts.append(str(item.get("value")))
            texts.append(str(item.get("name", "")))
        content = r.get("content") or {}
        texts.append(str(content.get("text", "")))
        if content.get("items"):
            texts.append(json.dumps(content["items"], ensure_ascii=False))
        for eff in r.get("effects") or []:
            texts.append(str(eff.get("target", "")))
            if eff.get("target"):
                effect_targets.append(str(eff["target"]))
                if eff.get("verification") == "verified":
                    action = str(eff.get("action", "")).strip().lower()
                    for claim, (actions, _) in PROOF_CLAIMS.items():
                        if action in actions:
                            proven[claim].append(str(eff["target"]))
            if eff.get("verification") in ("verified", "service_ack") and eff.get("target"):
                verified_targets.append(str(eff["target"]))
            if status == "succeeded" and eff.get("verification") == "verified" and eff.get("category") in ("owner_data", "workspace"):
                noted_ok = True
        texts.extend(str(u) for u in r.get("unknowns") or [])
        err = r.get("error") or {}
        texts.extend(str(err.get(k, "")) for k in ("code", "message"))
        nxt = r.get("next") or {}
        texts.append(str(nxt.get("check_with") or ""))
        if nxt.get("retry") == "forbidden" and status == "succeeded":
            forbidden_done = True
    texts.extend(t for f in facts if f.kind != "values" for t in (f.text, f.model_text))  # values match with their unit
    loose: set[float] = set()
    for t in texts:
        loose |= _loose_numbers(t)
    units = {s for s in _UNIT_INDEX} | {u.lower() for _, u in values} | {f.unit.lower() for f in facts if f.unit}
    return _Evidence(values, loose, sorted(units, key=len, reverse=True), statuses, verified_targets, effect_targets, proven, noted_ok,
                     forbidden_done)


def _matches(num: _Number, value: float, unit: str | None) -> bool:
    return _same(num.value, value) and (num.unit is None or unit is None or units_compatible(num.unit, unit))


def _checked(num: _Number, ev: _Evidence) -> bool:
    """A lone 一 (一个, 一次) is an article more often than a count: it is checked only when
    its unit is a specific one some receipt value uses."""
    if not num.bare_one:
        return True
    if num.unit is None or canonical_unit(num.unit) == "count":
        return False
    return any(units_compatible(num.unit, u) for _, u in ev.values)


def _number_ok(num: _Number, ev: _Evidence) -> bool:
    if not _checked(num, ev):
        return True
    if any(_matches(num, v, u) for v, u in ev.values):
        return True
    return any(_same(num.value, x) for x in ev.loose)


def _claim_reason(sentence: str, claims: set[str], ev: _Evidence) -> str | None:
    for claim in sorted(claims):
        if claim == "noted":
            if not ev.noted_ok:
                return "noted_without_verified_effect"
            continue
        if ev.statuses & CLAIM_STATUSES[claim]:
            continue
        if claim == "done" and any(t in sentence for t in ev.verified_targets):
            continue  # "已发送给 X": that effect is verified, even if the call was partial
        return "status_contradicts_receipts"
    return None


def _names(sentence: str, target: str) -> bool:
    """Whether a sentence names an effect's target: the target itself, or the name part of
    an address (alice@example.com: "Alice"), case aside."""
    low, target = sentence.lower(), target.lower()
    if target in low:
        return True
    name = target.split("@", 1)[0] if "@" in target else ""
    return len(name) >= 2 and re.search(rf"(?<![a-z0-9]){re.escape(name)}(?![a-z0-9])", low) is not None


def _proof_reason(sentence: str, claims: set[str], ev: _Evidence) -> str | None:
    """A read-back claim (``PROOF_CLAIMS``) stands only on a verified effect of an action that
    proves it, whose target the sentence names; a sentence that names no effect's target
    at all ("她会收到") stands when exactly one target is proven."""
    for claim in sorted(claims):
        _, reason = PROOF_CLAIMS[claim]
        proven = ev.proven[claim]
        if any(_names(sentence, t) for t in proven):
            continue
        if len(set(proven)) == 1 and not any(_names(sentence, t) for t in ev.effect_targets):
            continue
        return reason
    return None


# Quotation marks: each opener with its closer (a straight quote closes itself).
QUOTES = {"「": "」", "『": "』", "“": "”", "‘": "’", '"': '"', "«": "»", "＂": "＂"}
_CLOSE_ONLY = {close for open_, close in QUOTES.items() if close != open_}


def quoted_spans(sentence: str) -> list[tuple[int, int, str]]:
    """The quoted parts of a sentence: ``(start, end, inner text)``, the marks included in
    ``start:end``. A quote left open runs to the sentence's end, and a closing mark before
    any opening one closes a quote begun in the sentence before (``split_sentences`` cuts
    at a 。 inside a quote)."""
    spans: list[tuple[int, int, str]] = []
    i, n = 0, len(sentence)
    while i < n:
        ch = sentence[i]
        if ch in QUOTES:
            j = sentence.find(QUOTES[ch], i + 1)
            end = n if j < 0 else j + 1
            spans.append((i, end, sentence[i + 1 : n if j < 0 else j]))
            i = end
            continue
        if ch in _CLOSE_ONLY and not spans:
            spans.append((0, i + 1, sentence[:i]))
        i += 1
    return spans


def _without_owner_quotes(sentence: str, owner_words: list[str]) -> str:
    """The sentence without the quotes that are the owner's own words: a quoted part whose
    text (normalized: numerals, punctuation, case) is inside something the owner said and
    holds more than digits. Her words quoted back are not the model's claim; the rest of
    the sentence still is, and a quote she never said is checked like any other text."""
    if not owner_words:
        return sentence
    out, last = [], 0
    for start, end, inner in quoted_spans(sentence):
        said = _norm(inner)
        if said and not said.isdigit() and any(said in words for words in owner_words):
            out.append(sentence[last:start] + " ")
            last = end
    return "".join(out) + sentence[last:] if out else sentence


def _stated(fact: Fact, kept_text: str, claims: set[str], numbers: list[_Number], ev: _Evidence) -> bool:
    norm_kept = _norm(kept_text)
    if any(_norm(t) and _norm(t) in norm_kept for t in (fact.text, fact.voice)):
        return True
    if fact.kind == "values":
        if fact.number is not None:
            return any(_checked(n, ev) and _matches(n, fact.number, fact.unit) for n in numbers)
        return bool(_norm(str(fact.value))) and _norm(str(fact.value)) in norm_kept
    if fact.kind == "status":
        return any(fact.status in CLAIM_STATUSES[c] for c in claims)
    if fact.kind == "effects" and fact.verification in ("verified", "service_ack") and fact.target:
        return fact.target in kept_text
    return False


def check_reply(
    text: str,
    *,
    receipts: list[dict[str, Any]],
    delivered_fact_ids: set[str] | frozenset[str],
    facts: list[Fact],
    lang: str = "zh",
    voice: bool = False,
    owner_words: Sequence[str] = (),
) -> CheckResult:
    """Remove the sentences of a model reply that disagree with the receipts, then append
    the undelivered facts it does not state. Deterministic; zero model calls.

    Per sentence (numbers read after ``chinese_to_arabic``), the first failing rule removes it:

    - ``internal_marker``: the sentence carries an internal marker (a run/call id, a
      ``pack__tool`` name, a data-directory path, a token or secret, a stack-trace line:
      ``yimi_project.leaks``).
    - ``model_instruction``: the sentence carries the model's wording of a fact where it
      differs from the owner's ("不要重复", "重试前要先用「X」核查"): an instruction for the
      model, never for the owner.
    - ``number_not_in_receipts``: every number (with its adjacent unit, if any) must equal a
      receipt value with a compatible unit (``units_compatible``), or be spelled somewhere
      in the receipts' texts (content text/items, effect targets, string values, unknowns,
      error, check_with) or in a fact text — those match by value only. Ordinals (第二),
      numbers glued to letters (S3) and an article-like lone 一 are not checked. Times and
      dates are plain numbers: they must be in the receipts too. The owner's own words
      quoted back (``owner_words``: what she said in this exchange; a quoted part inside
      it that holds more than digits) are not the model's claim: their numbers and status
      words are not checked, the rest of the sentence is.
    - ``status_contradicts_receipts`` / ``noted_without_verified_effect``: a status word
      (``STATUS_WORDS``) must be backed by some receipt: done → succeeded (or the sentence
      names the target of a verified/service_ack effect), failed → failed, working →
      running/queued/waiting, partial → partial, cancelled → cancelled, noted → a succeeded
      receipt with a ``verified`` owner_data or workspace effect. Questions claim nothing.
    - ``delivery_not_proven`` / ``read_not_proven``: that the recipient got a message
      (会收到, 已送达, "will receive", "delivered"…) or read it (已读, "has read"…), not
      negated or conditional in its clause (不会收到, 还不知道会不会收到, "once it is
      delivered": ``PROOF_WORDS``/``PROOF_NEGATORS``), needs a ``verified`` effect whose
      action reads it back (``PROOF_CLAIMS``: ``deliver`` or ``seen`` for delivered, ``seen``
      for read) on a target the sentence names (the target, or an address's name part:
      "Alice" for alice@example.com); a sentence naming no effect's target stands when
      exactly one target is proven. No receipt status backs it, and a ``send`` effect never
      does: a server's acceptance is not the recipient's.
    - ``suggests_forbidden_retry``: if a receipt succeeded with ``retry: forbidden``, no
      sentence may suggest doing it again (``RETRY_WORDS``/``RETRY_PATTERNS``, unless
      negated: 不要再发一次; 要不要再发一次？ is a suggestion).
    - ``repeats_delivered_fact``: a sentence containing the text of a delivered fact (or
      equal to its voice version), or giving the number+unit of a delivered values fact
      that no undelivered values fact shares.

    Then every owner-facing fact (``Fact.for_owner``) of ``facts`` not in ``delivered_fact_ids`` and not stated by the kept text
    (values: the number with a compatible unit; status: a status word backing it; verified
    effects: the target named; otherwise the fact's text) is appended, with any internal
    marker in it redacted: its ``voice`` version when ``voice=True`` or ``lang`` ends in
    "voice", else its ``text``. Added texts that are identical are written once. Facts not
    passed in ``facts`` cannot be added or recognized as repeats.

    The same check runs sentence by sentence on a stream (``ReplyCheck``); both give the
    same text.
    """
    check = ReplyCheck(receipts=receipts, delivered_fact_ids=delivered_fact_ids, facts=facts, lang=lang, voice=voice,
                       owner_words=owner_words)
    for sentence in split_sentences(text):
        check.feed(sentence)
    check.finish()
    return check.result()


class ReplyCheck:
    """``check_reply`` one sentence at a time, for a reply that streams.

    ``feed(sentence)`` (a piece of ``split_sentences``: complete, with its closing marks and
    trailing whitespace) returns the text to send now — the sentence, or "" if it was
    removed; whitespace is held back until more text follows, so nothing leads or trails.
    ``finish()`` returns the tail: the appended facts (with a sentence mark before them
    when needed). Everything returned, joined, equals ``result().text``.
    """

    def __init__(
        self,
        *,
        receipts: list[dict[str, Any]],
        delivered_fact_ids: set[str] | frozenset[str],
        facts: list[Fact],
        lang: str = "zh",
        voice: bool = False,
        owner_words: Sequence[str] = (),
    ) -> None:
        self.voice = voice or lang.endswith("voice")
        self.owner_words = [w for w in (_norm(t) for t in owner_words if t) if w]  # what she said, normalized
        self.lang = lang
        self.facts = facts
        self.delivered_ids = delivered_fact_ids
        self.ev = _evidence(receipts, facts)
        self.delivered_values = [f for f in facts if f.kind == "values" and f.number is not None and f.id in delivered_fact_ids]
        self.fresh_values = [f for f in facts if f.kind == "values" and f.number is not None and f.id not in delivered_fact_ids]
        self.delivered = [f for f in facts if f.id in delivered_fact_ids]
        # The model's wording of a fact, where it is not the owner's: an instruction that
        # must not reach the owner even when the model copies it into its reply.
        self.instructions = {_norm(f.model_text) for f in facts if f.model_text != f.text and _norm(f.model_text)}
        self.removed: list[tuple[str, str]] = []
        self.kept_claims: set[str] = set()
        self.kept_numbers: list[_Number] = []
        self.sent = ""  # what feed() and finish() returned so far
        self.pending_space = ""
        self.added: list[Fact] = []
        self.told: list[str] = []
        self.finished = False

    def _reason(self, stripped: str) -> tuple[str | None, list[_Number], set[str]]:
        ev = self.ev
        if find_markers(stripped):
            return "internal_marker", [], set()
        norm = _norm(stripped)
        if any(norm_instruction in norm for norm_instruction in self.instructions):
            return "model_instruction", [], set()
        claimed = _without_owner_quotes(stripped, self.owner_words)  # her words quoted back claim nothing
        numbers = _numbers(claimed, ev.units)
        claims = status_claims(claimed)
        reason: str | None = None
        if any(not _number_ok(n, ev) for n in numbers):
            reason = "number_not_in_receipts"
        if reason is None:
            reason = _claim_reason(claimed, claims, ev)
        if reason is None:
            reason = _proof_reason(claimed, proof_claims(claimed), ev)
        if reason is None and ev.forbidden_done and suggests_retry(stripped):
            reason = "suggests_forbidden_retry"
        if reason is None and (
            any((_norm(f.text) and _norm(f.text) in norm) or (_norm(f.voice) and norm == _norm(f.voice)) for f in self.delivered)
            or any(
                _checked(n, ev)
                and any(_matches(n, f.number, f.unit) for f in self.delivered_values if f.number is not None)
                and not any(_matches(n, f.number, f.unit) for f in self.fresh_values if f.number is not None)
                for n in numbers
            )
        ):
            reason = "repeats_delivered_fact"
        return reason, numbers, claims

    def feed(self, sentence: str) -> str:
        """Check one complete sentence; the text to send now ("" if none)."""
        stripped = sentence.strip()
        if not stripped:
            if self.sent:
                self.pending_space += sentence
            return ""
        reason, numbers, claims = self._reason(stripped)
        if reason:
            self.removed.append((stripped, reason))
            return ""
        self.kept_claims |= claims
        self.kept_numbers.extend(numbers)
        body = sentence.rstrip()
        out = (self.pending_space + body) if self.sent else body.lstrip()
        self.pending_space = sentence[len(body):]
        self.sent += out
        return out

    def system(self, text: str) -> str:
        """A sentence worded by the platform itself (not the model): kept unchecked, with the
        same whitespace handling as ``feed``; the text to send now."""
        body = text.rstrip()
        if not body.strip():
            return ""
        out = (self.pending_space + body) if self.sent else body.lstrip()
        self.pending_space = text[len(body):]
        self.sent += out
        return out

    def finish(self) -> str:
        """Append the undelivered facts the kept text does not state; the tail to send."""
        if self.finished:
            return ""
        self.finished = True
        kept_text = self.sent
        for fact in self.facts:
            if fact.id in self.told or not fact.for_owner:
                continue  # a fact only the model reads is never told
            if _stated(fact, kept_text, self.kept_claims, self.kept_numbers, self.ev):
                self.told.append(fact.id)
            elif fact.id not in self.delivered_ids:
                self.added.append(fact)
                self.told.append(fact.id)
        pieces: list[str] = []
        for fact in self.added:
            piece = redact_markers(fact.voice if self.voice else fact.text)
            if piece not in pieces:
                pieces.append(piece)
        sep = "" if self.lang.startswith("zh") or self.lang == "voice" else " "
        tail = ""
        if pieces:
            if kept_text and not re.search(r"[。！？!?；;：:.…」”)）]$", kept_text):  # a colon introduces the facts
                tail += "。" if sep == "" else "."
            tail += (sep if kept_text else "") + sep.join(pieces)
        self.sent += tail
        return tail

    def result(self) -> CheckResult:
        return CheckResult(text=self.sent, removed=list(self.removed), added=list(self.added), told=list(self.told))
