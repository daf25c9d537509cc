"""The dispatch index: queued jobs by order key, tenant caps and in-flight leases.

``RedisIndex`` is the real thing (Lua scripts); ``MemoryIndex`` is its in-memory twin. Both
satisfy ``DispatchIndex`` and pass one contract suite.
"""

from __future__ import annotations

from jobs.index.base import (
    Admitted,
    DispatchIndex,
    IndexedJob,
    Lease,
    LiveWorker,
    NotLeader,
    Renewal,
    TierDepth,
)
from jobs.index.memory import MemoryIndex
from jobs.index.redis_index import RedisIndex

__all__ = [
    "Admitted",
    "DispatchIndex",
    "IndexedJob",
    "Lease",
    "LiveWorker",
    "MemoryIndex",
    "NotLeader",
    "RedisIndex",
    "Renewal",
    "TierDepth",
]
