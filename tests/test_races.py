"""Races proven with real concurrency ("exactly once, for real").

Every racer is an OS thread with its own database connection (Django keeps one per
thread; on PostgreSQL each comes from the pool), and a ``threading.Barrier`` releases them
together. ``asyncio.gather`` of ``database_sync_to_async`` calls proves nothing here: those
run one after another on one thread and one connection. Async code (an execution) runs in
each racer under its own ``async_to_sync``, which keeps its database work on that racer's
thread. A race that one attempt may not interleave is repeated a few times. Each racer
closes its connection at the end, so the test database can be dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from brain.models import Run
from brain.services import accept_utterance
from capabilities.mcp_host import runtime
from capabilities.models import ReceiptRecord, ToolCall
from capabilities.services import CallRequest, Decision, decide
from consent import services as consent
from consent.models import ConsentCard
from tests.conftest import new_client_id
from tests.gateway_support import copy_repo_pack, write_pack
from tests.test_consent import OUTBOX_TOOLS, outbox_manifest
from yimi_project.errors import YimiError

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 5
# Races whose losing interleaving is narrow (two UPDATEs of one row at the same moment; a
# sweeper's read of its due list and its update straddling an approval) get more rounds.
NARROW_ROUNDS = 20


def race(*racers: Callable[[], Any]) -> list[Any]:
    """Run each racer in its own thread, all released at once; return what each returned,
    or the code of the ``YimiError`` it raised. Anything else a racer raises fails the test."""
    barrier = threading.Barrier(len(racers))
    results: list[Any] = [None] * len(racers)
    crashes: list[BaseException] = []

    def run(index: int, racer: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=30)
            results[index] = racer()
        except YimiError as exc:
            results[index] = exc.code
        except BaseException as exc:
            crashes.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, racer), name=f"racer-{i}") for i, racer in enumerate(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a racer never finished"
    if crashes:
        raise crashes[0]
    return results


@pytest.fixture
def packs(tmp_path: Path, settings: Any) -> Any:
    directory = tmp_path / "packs"
    directory.mkdir()
    write_pack(directory, "outbox", outbox_manifest(), tools_py=OUTBOX_TOOLS)
    copy_repo_pack(directory, "shop")
    settings.YIMI_PACKS_DIR = directory
    settings.YIMI_WORKSPACE_DIR = tmp_path / "workspace"  # the outbox's log of what it sent
    settings.DATA_DIR = tmp_path / "data"  # the shop's store.json lives under it
    settings.DATA_DIR.mkdir()
    runtime.reset_for_tests()
    yield directory
    runtime.reset_for_tests()


@pytest.fixture
def phone(make_device: Any, packs: Path) -> Any:
    return make_device("phone")


def new_run(sim: Any) -> Run:
    return Run.objects.get(id=accept_utterance(sim.device, new_client_id(), "please").run_id)


def decide_call(run: Run, tool: str, **args: Any) -> Decision:
    return decide(CallRequest(str(run.id), tool, args))


def sent(settings: Any) -> list[str]:
    log = Path(settings.YIMI_WORKSPACE_DIR) / "executed.log"
    return log.read_text().splitlines() if log.exists() else []


def latest_receipt(call_id: Any) -> ReceiptRecord:
    return ReceiptRecord.objects.filter(call_id=call_id).order_by("-revision").first()


# --- the gateway: duplicates and cards ------------------------------------------------------------


def test_concurrent_first_attempts_of_one_retry_forbidden_send_allow_exactly_one(phone: Any) -> None:
    """The same remembered send (retry=forbidden), decided three times at once before any
    result: one runs, the others are told it is already running."""
    run = new_run(phone)
    first = decide_call(run, "outbox__send", to="xiaolin", text="hello", owner_requested=True)
    card = ConsentCard.objects.get(id=first.card_id)
    consent.answer_card(phone.device, card.id, "approve", phone.sign(consent.card_message(card, "approve")))
    for attempt in range(ROUNDS):
        send = partial(decide_call, run, "outbox__send", to="xiaolin", text=f"round {attempt}", owner_requested=True)
        decisions = race(send, send, send)
        assert sum(d.executes for d in decisions) == 1, [(d.decision, d.code) for d in decisions]
        assert sorted(d.code for d in decisions if not d.executes) == ["already_running", "already_running"]


def test_concurrent_first_attempts_of_a_call_that_needs_a_card_open_exactly_one_card(phone: Any) -> None:
    run = new_run(phone)
    for attempt in range(ROUNDS):
        send = partial(decide_call, run, "outbox__send", to="xiaolin", text=f"round {attempt}")
        decisions = race(send, send, send)
        assert sorted(d.decision for d in decisions) == ["ask", "block", "block"], [(d.decision, d.code) for d in decisions]
        assert {d.code for d in decisions if d.decision == "block"} == {"already_waiting"}
        fingerprint = ToolCall.objects.get(id=decisions[0].call_id).fingerprint
        assert ConsentCard.objects.filter(call__fingerprint=fingerprint).count() == 1
