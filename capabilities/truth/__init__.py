"""Facts are said by the system: fixed-template facts and a deterministic reply checker.

A tool call's receipt (``contracts/receipt.v1.schema.json``, normalized by
``capabilities.receipts``) carries facts of six kinds: status, effects, values, unknowns,
next and diff (``facts`` says what each is). All of it is deterministic: there is no model
call anywhere in this package.

The modules, each importing only from those listed before it:

``facts``       the fact kinds, the template table, ``Fact`` and its stable id,
                ``render_facts`` and ``render_diff``;
``numerals``    Chinese numerals in running text → Arabic digits (``chinese_to_arabic``);
``quantities``  units and their synonyms, and the numbers a text states with their units;
``claims``      what a sentence claims (status words, retry suggestions), and
                ``split_sentences``;
``checker``     ``check_reply`` (and ``ReplyCheck``, the same per sentence, for streams):
                drops the sentences that disagree with the receipts or leak internal
                markers (``yimi_project.leaks``), and
                appends the undelivered facts the reply does not state;
``cards``       ``activity_card``.

Callers import the public names from here.
"""

from __future__ import annotations

from capabilities.truth.cards import activity_card
from capabilities.truth.checker import CheckResult, ReplyCheck, check_reply
from capabilities.truth.claims import split_sentences
from capabilities.truth.facts import FACT_KINDS, STATUSES, TEMPLATES, Fact, render_diff, render_facts
from capabilities.truth.numerals import chinese_to_arabic
from capabilities.truth.quantities import units_compatible

__all__ = [
    "FACT_KINDS",
    "STATUSES",
    "TEMPLATES",
    "CheckResult",
    "ReplyCheck",
    "Fact",
    "activity_card",
    "check_reply",
    "chinese_to_arabic",
    "render_diff",
    "render_facts",
    "split_sentences",
    "units_compatible",
]
