"""The brain app's wiring, run once when Django starts (``BrainConfig.ready``): what brain
registers with the layers below it (forgetting's redactors, the privacy epoch's
invalidators, the catalog embedder, the gateway's run binder and agent limit, the payment
starter, the health check), its Celery tasks and their executors by name (importing
``brain.tasks``), and a worker's signals: recover runs when it is ready, serve the run lane
(``brain.run_lane``) until it shuts down."""

import asyncio

from celery.signals import worker_ready, worker_shutting_down
from django.apps import AppConfig

from capabilities import authorities
from memory import copies
from yimi_project import push


def _recover_runs_on_worker_start(**_: object) -> None:
    from brain.recovery import recover_runs

    asyncio.run(recover_runs())


def _serve_run_lane(**_: object) -> None:
    from brain import run_lane

    run_lane.start_on_worker()


def _stop_run_lane(**_: object) -> None:
    from brain import run_lane

    run_lane.stop_on_worker()


class BrainConfig(AppConfig):
    name = "brain"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Here, not at the top: these modules import models, which exist only once the app
        # registry is ready (llm is a layer below; no cycle is being dodged).
        from brain import run_pins, tasks  # noqa: F401 - tasks: below
        from brain.agents import agent_categories, redact_payload
        from brain.dispatch import start_payment
        from brain.services import run_binding
        from llm import roles
        from payments.services import EXECUTE_PAYMENT_TASK

        # Importing brain.tasks registers every Celery task of brain/ and, with
        # brain.executors, the coroutine that executes each kind of work by its task name:
        # brain.dispatch and the run lane start work by name in every process, this one included.

        copies.register("brain", redact_payload, models=("brain.AgentTask",))  # forgetting redacts the copies in sub-agent tasks
        authorities.register_run_binder(run_binding)  # the gateway binds each call to its run
        authorities.register_agent_limit(agent_categories)  # a self-check agent only observes
        push.register_starter(EXECUTE_PAYMENT_TASK, start_payment)  # an auto-payment, once authorized
        roles.register_run_pins(run_pins.read_pin, run_pins.write_unset_pin)  # a run's tree keeps the model roles it started with
        # A Celery worker recovers the runs a dead worker left (brain.recovery) when it is ready.
        worker_ready.connect(_recover_runs_on_worker_start, weak=False, dispatch_uid="brain.recover_runs")
        # ... and serves the run lane (brain.run_lane) until it shuts down.
        worker_ready.connect(_serve_run_lane, weak=False, dispatch_uid="brain.run_lane")
        worker_shutting_down.connect(_stop_run_lane, weak=False, dispatch_uid="brain.run_lane.stop")
