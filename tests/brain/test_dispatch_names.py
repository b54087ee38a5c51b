"""Work is started by name (``brain.dispatch``, ``brain.executors``): every name dispatch sends
has a Celery task registered under it in this process (a worker would otherwise drop the
message as unregistered), and every kind it runs in process without a broker has its
executor registered, by importing nothing but what ``BrainConfig.ready`` imports."""

from __future__ import annotations

from brain import executors
from payments.services import EXECUTE_PAYMENT_TASK
from yimi_project.celery import app

IN_PROCESS = (executors.RUN, executors.AGENT_TASK, executors.CARD_EXECUTION, EXECUTE_PAYMENT_TASK)
SENT_BY_NAME = IN_PROCESS


def test_every_name_dispatch_sends_is_a_registered_celery_task() -> None:
    missing = [name for name in SENT_BY_NAME if name not in app.tasks]
    assert not missing, missing


def test_every_kind_of_work_run_in_process_has_its_executor() -> None:
    from brain.agent_loop import execute_agent_task
    from brain.consent_execution import execute_approved
    from brain.payment_execution import execute_payment
    from brain.runner import execute_run

    expected = {executors.RUN: execute_run, executors.AGENT_TASK: execute_agent_task,
                executors.CARD_EXECUTION: execute_approved, EXECUTE_PAYMENT_TASK: execute_payment}
    assert {name: executors.executor(name) for name in IN_PROCESS} == expected
