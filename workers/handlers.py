"""The handler contract, as handler authors import it: ``from workers.handlers import ...``.

The contract lives in ``jobs.execution.handlers`` and the registry in
``jobs.execution.registry`` (no Celery in either, and the API validates payloads with them);
this module is their documented face (docs/handlers.md), which stays put whatever moves behind.
"""

from jobs.core.packing import Packing
from jobs.execution.handlers import (
    MAX_SLEEP_S,
    EchoHandler,
    Handler,
    JobCancelled,
    JobContext,
    JobInterrupted,
    JobTimedOut,
    LeaseLost,
    PackingHandler,
    RetryableError,
    SleepHandler,
    WorkerStopping,
    check_run,
    parse_payload,
)
from jobs.execution.registry import (
    ENTRY_POINT_GROUP,
    HANDLERS_ENV,
    HandlerRegistry,
    builtin_handlers,
    default_registry,
    kind_packing,
    load_entry_points,
    load_handlers,
)

__all__ = [
    "ENTRY_POINT_GROUP", "HANDLERS_ENV", "MAX_SLEEP_S", "EchoHandler", "Handler",
    "HandlerRegistry", "JobCancelled", "JobContext", "JobInterrupted", "JobTimedOut", "LeaseLost",
    "Packing", "PackingHandler", "RetryableError", "SleepHandler", "WorkerStopping",
    "builtin_handlers", "check_run", "default_registry", "kind_packing", "load_entry_points",
    "load_handlers", "parse_payload",
]
