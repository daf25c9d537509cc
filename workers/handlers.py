"""The handler contract, as handler authors import it: ``from workers.handlers import ...``.

The contract itself lives in ``jobs.execution.handlers`` (it has no Celery in it, and the API
validates payloads with it); this module is its documented face (docs/handlers.md).
"""

from jobs.execution.handlers import (
    ENTRY_POINT_GROUP,
    HANDLERS_ENV,
    MAX_SLEEP_S,
    EchoHandler,
    Handler,
    HandlerRegistry,
    JobCancelled,
    JobContext,
    JobInterrupted,
    LeaseLost,
    RetryableError,
    SleepHandler,
    WorkerStopping,
    builtin_handlers,
    default_registry,
    load_entry_points,
    load_handlers,
    parse_payload,
)

__all__ = [
    "ENTRY_POINT_GROUP", "HANDLERS_ENV", "MAX_SLEEP_S", "EchoHandler", "Handler",
    "HandlerRegistry", "JobCancelled", "JobContext", "JobInterrupted", "LeaseLost",
    "RetryableError", "SleepHandler", "WorkerStopping", "builtin_handlers", "default_registry",
    "load_entry_points", "load_handlers", "parse_payload",
]
