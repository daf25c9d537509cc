"""The packing bench's processes: tierq's API and dispatcher for the whole run, and one
4-slot worker per measured mode, started with that mode's configuration.

Packing is the worker's business (its registry takes the configuration's ``[kinds]``), so
the two modes differ only in the worker's ``TIERQ_CONFIG``: the same API, dispatcher,
database and Redis serve both, and a worker is stopped (its slots leave the pool) before
the next starts. The evaluation's workers load the model before they register their slots
(``TIERQ_WORKER_SETUP=eager``): once the pool shows 4 slots, no item pays for it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from e2e_stack import ADMIN_KEY, Child, child, free_port, wait_until

REPO = Path(__file__).resolve().parent.parent
SLOTS = 4
BULK, PREMIUM = "standard", "premium"
HANDLERS = "bench.packing_handlers:HANDLERS"


def config(bulk_share: float, kinds: dict[str, int] | None = None) -> str:
    """Premium single jobs beside a standard tenant's batch, which may hold ``bulk_share``
    of the slots (a run counts one, whatever its items). Bounds nothing reaches: the batch's
    items are fed as fast as the feeder goes."""
    text = f"""
[policy]
mean_service_s = 0.05

[tiers.{PREMIUM}]
base_priority = 0
max_wait_s = 3600
tenant_share = 1.0

[tiers.{BULK}]
base_priority = 10
max_wait_s = 3600
tenant_share = {bulk_share}
queued_share = 1.0
"""
    for kind, items in (kinds or {}).items():
        text += f'\n[kinds."{kind}"]\nmax_items_per_run = {items}\n'
    return text


@dataclass
class Stack:
    url: str
    env: dict[str, str]
    workdir: Path
    bulk_share: float
    processes: dict[str, Child] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)

    def http(self, tenant: str, timeout: float = 60) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout,
                            headers={"Authorization": f"Bearer {self.keys[tenant]}"})

    def capacity(self) -> int:
        with self.http(BULK, timeout=10) as http:
            value: int = http.get("/v1/queues").json()["pool"]["capacity"]
        return value

    @contextlib.contextmanager
    def worker(self, name: str, kinds: dict[str, int], *, eager: bool,
               threads: int, loglevel: str = "WARNING") -> Iterator[Child]:
        """A 4-slot threads worker whose configuration overrides ``kinds``' packing; yielded
        once its slots are in the pool (its handlers set up first when ``eager``)."""
        path = self.workdir / f"tierq-{name}.toml"
        path.write_text(config(self.bulk_share, kinds))
        env = {**self.env, "TIERQ_CONFIG": str(path),
               "TIERQ_WORKER_SETUP": "eager" if eager else "lazy",
               "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        command = [sys.executable, "-m", "jobs.cli", "worker", "--celery-pool", "threads",
                   "--concurrency", str(SLOTS), "--loglevel", loglevel]
        with child(f"worker-{name}", command, env=env, workdir=self.workdir) as process:
            def ready() -> bool:
                process.check()
                return self.capacity() >= SLOTS

            wait_until(f"worker {name}: its slots in the pool", ready, timeout=180)
            self.processes["worker"] = process
            try:
                yield process
            finally:
                process.stop(grace=30)
                del self.processes["worker"]
        wait_until(f"worker {name}: its slots gone from the pool",
                   lambda: self.capacity() == 0, timeout=60)


@contextlib.contextmanager
def stack(database_url: str, redis_url: str, workdir: Path, *, bulk_share: float,
          ) -> Iterator[Stack]:
    """The API and the dispatcher, and the two tenants (``standard``: the batches;
    ``premium``: the single jobs)."""
    base = workdir / "tierq.toml"
    base.write_text(config(bulk_share))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERQ_")}
    path = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.update(TIERQ_DATABASE_URL=database_url, TIERQ_REDIS_URL=redis_url,
               TIERQ_ADMIN_KEY=ADMIN_KEY, TIERQ_CONFIG=str(base), TIERQ_HANDLERS=HANDLERS,
               TIERQ_WORKER_SETUP="lazy", PYTHONPATH=path, PYTHONUNBUFFERED="1")
    port = free_port()
    cli = [sys.executable, "-m", "jobs.cli"]
    with contextlib.ExitStack() as stack:
        api = stack.enter_context(child("api", [*cli, "api", "--host", "127.0.0.1", "--port",
                                                str(port), "--log-level", "warning"],
                                        env=env, workdir=workdir))
        dispatcher = stack.enter_context(child("dispatcher", [*cli, "dispatcher"], env=env,
                                               workdir=workdir))
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            api.check()
            dispatcher.check()
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200

        wait_until("the tierq API is ready", ready, timeout=90)
        system = Stack(url=url, env=env, workdir=workdir, bulk_share=bulk_share,
                       processes={"api": api, "dispatcher": dispatcher})
        with httpx.Client(base_url=url, timeout=30,
                          headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
            for tier in (BULK, PREMIUM):
                made = admin.post("/v1/admin/tenants", json={"name": tier, "tier": tier})
                made.raise_for_status()
                system.keys[tier] = made.json()["api_key"]
        yield system
