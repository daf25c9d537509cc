"""``/v1/admin/workers``: the live workers, the device each runs on and the slots it brings
(admin key). Read from the index's registrations, on Redis's clock; nothing in SQL."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from jobs.api.deps import AdminDep, RuntimeDep, refuse_unknown_query
from jobs.api.errors import error_responses
from jobs.api.queue_schemas import WorkerView

router = APIRouter(prefix="/v1/admin/workers", tags=["workers"],
                   dependencies=[Depends(refuse_unknown_query)])


class WorkerListResponse(BaseModel):
    """The live workers and the capacity they bring."""

    workers: list[WorkerView] = Field(description="live workers of every pool, by pool "
                                      "(default first), then id")
    slots: int = Field(ge=0, description="the sum of their slots: the fleet's live capacity")
    slots_by_pool: dict[str, int] = Field(default_factory=dict, description="the same sum per "
                                          "pool: each pool's live capacity (0: no live worker)")


@router.get(
    "",
    response_model=WorkerListResponse,
    summary="The live workers: device and slots of each",
    description="Every worker whose registration has not lapsed, with the device it runs "
    "on and the slots it brings; a worker that stopped cleanly is gone at once, one that died "
    "once its registration lapses.",
    responses=error_responses("unauthorized", "forbidden", "unavailable"),
)
def list_workers(_: AdminDep, runtime: RuntimeDep) -> WorkerListResponse:
    now = runtime.index.now()
    workers: list[WorkerView] = []
    by_pool: dict[str, int] = {}
    for pool in runtime.every_pool():
        live = pool.index.live_workers(now=now)
        workers.extend(WorkerView.of(w, now, pool.pool) for w in live)
        by_pool[pool.pool] = sum(w.slots for w in live)
    return WorkerListResponse(workers=workers, slots=sum(by_pool.values()),
                              slots_by_pool=by_pool)
