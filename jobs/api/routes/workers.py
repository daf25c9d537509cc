"""``/v1/admin/workers``: the live workers, the device each runs on and the slots it brings
(admin key). Read from the index's registrations, on Redis's clock; nothing in SQL."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from jobs.api.deps import AdminDep, RuntimeDep, refuse_unknown_query
from jobs.api.errors import error_responses
from jobs.api.schemas import WorkerView

router = APIRouter(prefix="/v1/admin/workers", tags=["workers"],
                   dependencies=[Depends(refuse_unknown_query)])


class WorkerListResponse(BaseModel):
    """The live workers and the capacity they bring."""

    workers: list[WorkerView] = Field(description="live workers, by id")
    slots: int = Field(ge=0, description="the sum of their slots: the pool's live capacity")


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
    live = runtime.index.live_workers(now=now)
    return WorkerListResponse(
        workers=[WorkerView.of(w, now) for w in live],
        slots=sum(w.slots for w in live),
    )
