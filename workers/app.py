"""The Celery app: one kombu queue per tier, prefetch off, acked on receipt, no results.

Celery only carries "start job X, attempt N"; leases, not the broker, recover lost work, so
messages are acked on receipt (``task_acks_late=False``) and Celery's redelivery never
re-runs a long job. Results live in SQL: no result backend. Task events are off until Flower
asks for them (its ``enable_events`` broadcast); then a failed job's task shows FAILURE there
(``workers.tasks``). Redis or RabbitMQ: ``workers.broker`` holds what differs between them.

``make_celery(settings)`` builds a worker app (task + worker hooks); ``base_app(settings)``
the same configuration without them, for processes that only publish.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery, signals
from kombu.entity import Exchange, Queue

from jobs.index import wake
from jobs.process.settings import Settings
from workers import embedding
from workers.broker import (
    BrokerNames,
    broker_names,
    own_queue_arguments,
    queue_arguments,
    transport_config,
)
from workers.registration import WorkerRegistration, registration_ttl_s
from workers.tasks import WorkerResources, register_tasks

logger = logging.getLogger("tierq.worker")


def names_of(settings: Settings) -> BrokerNames:
    """This deployment's broker names (``workers.broker``): its queues are its own."""
    return broker_names(settings.resolved_broker_url(), settings.key_prefix, settings.pool)


# How long a prefork child may take to set its handlers up (load a model) before it runs.
PROC_SETUP_TIMEOUT_S = 300.0


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings for ``settings``: shared by workers and publishers."""
    broker = settings.resolved_broker_url()
    names = names_of(settings)
    exchange = Exchange(names.exchange, type="direct")  # type: ignore[no-untyped-call]
    queues = [
        Queue(  # type: ignore[no-untyped-call]
            names.queue(tier), exchange, routing_key=names.queue(tier), durable=True,
            queue_arguments=queue_arguments(broker),
        )
        for tier in settings.tiers
    ]
    config: dict[str, Any] = {
        "broker_url": broker,
        "broker_connection_retry_on_startup": True,
        "result_backend": None,
        "task_ignore_result": True,
        "task_acks_late": False,
        # Consulted only for late acks; set so that a task ending FAILURE (a failed job) or a
        # lost worker can never hand its message back, whatever acks_late becomes.
        "task_acks_on_failure_or_timeout": True,
        "task_reject_on_worker_lost": False,
        "task_queues": queues,
        "task_default_queue": queues[0].name,
        "task_default_exchange": names.exchange,
        "task_default_routing_key": queues[0].routing_key,
        "task_serializer": "json",
        "accept_content": ["json"],
        "worker_prefetch_multiplier": 1,
        # Task events cost the broker three messages a job: off until a monitor asks
        # (Flower broadcasts ``enable_events`` to the workers while it runs).
        "worker_send_task_events": False,
        "task_send_sent_event": False,
        "worker_hijack_root_logger": False,
        # Celery 6's default, set now: only late-acked tasks are affected, and ours are
        # acked on receipt, so a lost broker connection leaves running jobs running.
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        # A prefork child sets its handlers up before it reports alive (``workers.main``):
        # loading a model takes seconds, far past Celery's 4 s.
        "worker_proc_alive_timeout": PROC_SETUP_TIMEOUT_S,
        # Deployments (and test runs) sharing a broker stay apart: prefixed keys on Redis,
        # prefixed names on RabbitMQ; publisher confirms there (``workers.broker``).
        **transport_config(broker, settings.key_prefix),
    }
    return config


def own_queue(settings: Settings, hostname: str) -> Queue:
    """The queue only this worker consumes: a slot it frees takes its next job from here
    (``workers.tasks``), bound to the tier queues' exchange by its own name."""
    return _routed_by_name(settings, names_of(settings).own_queue(hostname))


def kind_queue(settings: Settings, kind: str) -> Queue:
    """A kind's queue (``BrokerNames.kind_queue``), declared alike by the workers that consume
    it and the dispatcher that publishes to it; on RabbitMQ it goes once unused, as a
    worker's own queue does."""
    return _routed_by_name(settings, names_of(settings).kind_queue(kind))


def _routed_by_name(settings: Settings, name: str) -> Queue:
    """A queue bound to the tier queues' exchange by its own name (a worker's, a kind's)."""
    exchange = Exchange(names_of(settings).exchange, type="direct")  # type: ignore[no-untyped-call]
    return Queue(  # type: ignore[no-untyped-call]
        name, exchange, routing_key=name, durable=True,
        queue_arguments=own_queue_arguments(settings.resolved_broker_url()),
    )


def base_app(settings: Settings, name: str = "tierq") -> Celery:
    app = Celery(name, set_as_current=False)
    app.conf.update(celery_config(settings))
    return app


def make_celery(settings: Settings) -> Celery:
    """The worker app: ``tierq.run_job`` registered; the Runtime and handlers are built per
    worker process on first use; the worker registers its slots once it is ready."""
    app = base_app(settings)
    resources = WorkerResources(settings)
    register_tasks(app, resources)
    _install_worker_hooks(app, resources)
    return app


class _WorkerLifecycle:
    """Starts the registration when the worker is ready; stops it when the worker leaves."""

    def __init__(self, app: Celery, resources: WorkerResources) -> None:
        self.app = app
        self.resources = resources
        self.registration: WorkerRegistration | None = None

    def on_ready(self, sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not self.app:
            return
        controller = sender.controller
        if self.resources.in_process is not None:
            self.resources.in_process.ready(sender)
        slots = int(getattr(controller, "max_concurrency", None) or controller.concurrency)
        runtime = self.resources.runtime()
        device = embedding.device()
        tier_push = self.resources.tier_push(self.app)
        if tier_push is not None:  # submits may now push their jobs' messages themselves
            runtime.index.set_tier_push(tier_push)
        self.registration = WorkerRegistration(
            runtime.index,
            worker_id=str(sender.hostname),
            slots=slots,
            ttl_s=registration_ttl_s(runtime.policy),
            device=device,
            memory_bytes=embedding.device_memory_bytes(device),
            kinds=self.resources.kinds,
            on_register=lambda: wake.ring(runtime.redis, runtime.prefix),
        )
        self.registration.start()

    def on_shutting_down(self, sender: Any = None, **_: Any) -> None:
        """Sent from a signal handler: unregister in a thread, so that no lock this thread
        might hold is taken again (the worker drains its running jobs meanwhile)."""
        registration = self.registration
        if registration is not None and sender == registration.worker_id:
            threading.Thread(target=registration.stop, name="unregister").start()

    def on_shutdown(self, sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not self.app:
            return
        if self.registration is not None:
            self.registration.stop()
        self.resources.close()


def _install_worker_hooks(app: Celery, resources: WorkerResources) -> None:
    lifecycle = _WorkerLifecycle(app, resources)
    app.tierq_lifecycle = lifecycle
    signals.worker_ready.connect(lifecycle.on_ready, weak=False)
    signals.worker_shutting_down.connect(lifecycle.on_shutting_down, weak=False)
    signals.worker_shutdown.connect(lifecycle.on_shutdown, weak=False)
