"""``/v1/admin/workers``: the live workers, the device each runs on and the slots it brings
(admin key). Read from the index's registrations, on Redis's clock; nothing in SQL."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from jobs.api.deps import AdminDep, RuntimeDep, refuse_unknown_query
from jobs.api.errors import error_responses

router = APIRouter(prefix="/v1/admin/workers", tags=["workers"],
                   dependencies=[Depends(refuse_unknown_query)])


class WorkerView(BaseModel):
    """A live worker."""

    id: str = Field(description="the worker's name (Celery's hostname: name@host)")
    device: str = Field(description="what it runs jobs on: cuda:N or cpu")
    slots: int = Field(ge=0, description="jobs it runs at once: what it adds to the pool")
    expires_in_s: float = Field(description="seconds until its registration lapses unless "
                                "renewed (it renews every third of that)")


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
        workers=[WorkerView(id=w.worker_id, device=w.device, slots=w.slots,
                            expires_in_s=round(max(0.0, w.expires_at - now), 3))
                 for w in live],
        slots=sum(w.slots for w in live),
    )
