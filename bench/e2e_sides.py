"""The systems of the end-to-end bench, driven the same way: submit, wait, time a start.

Each side submits from client threads (``hammer`` / ``paced``), knows when N of its jobs have
their result stored, takes one idle-latency sample (submit → the handler's own start
mark), and runs N jobs that each hold a slot (``hold_jobs``, the GPU-like run). Each counts
the SQL transactions and Redis commands it spends itself on watching, so that the meters
can leave them out.

tierq: ``POST /v1/jobs`` over httpx keep-alive, one tenant per client thread; done is
``status = 'succeeded'`` counted in SQL. Celery: ``apply_async``; done is the result key
(``celery-task-meta-<id>``) existing in Redis, read by a client of the bench's own.
procrastinate, the PostgreSQL queue: ``e2e_procrastinate.py``.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import redis
import sqlalchemy as sa
from bare_celery import HOLD, MARK, NOOP, make_app
from e2e_meters import ThreadCpu
from e2e_stack import Tierq, broker_url
from submit import Figures, hammer

MakeCall = Callable[[], Callable[[int], bool]]
TERMINAL = {"succeeded", "failed", "cancelled", "expired"}
# An idle system: this long between latency samples.
IDLE_GAP_S = 0.05


def paced(clients: int, count: int, rate: float, make_call: MakeCall) -> Figures:
    """Open loop: call ``n`` is due at ``n / rate`` s; its latency runs from when it was
    due, so a slow answer also charges the calls it delayed."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    start = [0.0]
    # The clock starts once every client is made (a client of an HTTP library loads its TLS
    # context, tens of ms each): a call is never due before its client could have made it.
    barrier = threading.Barrier(
        clients + 1, action=lambda: start.__setitem__(0, time.perf_counter() + 0.05))

    def client(i: int) -> None:
        call = make_call()
        barrier.wait()
        for n in range(i, count, clients):
            due = start[0] + n / rate
            time.sleep(max(0.0, due - time.perf_counter()))
            call(n)
            latencies[i].append(time.perf_counter() - due)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    for thread in threads:
        thread.join()
    return Figures(done=count, wall_s=time.perf_counter() - start[0],
                   latencies_s=[x for per_client in latencies for x in per_client])


Id = TypeVar("Id", str, int)


def wait_all(ids: list[Id], pending: Callable[[list[Id]], list[Id]], timeout: float) -> None:
    """Wait until every job's result is stored, asking for all those still waited for in one
    read each time (``pending``: the ones of them not stored yet). The bench's own reads run
    while the measured system still works: one read per job would take from it a share of the
    machine that is not the same from one side to the next."""
    deadline = time.monotonic() + timeout
    left = list(ids)
    while left := pending(left):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(left)} results not stored within {timeout:.0f} s")
        time.sleep(0.005)


def not_succeeded(ids: list[Id], rows: Iterable[tuple[Id, str]], *, failed: Collection[str],
                  system: str) -> list[Id]:
    """Those of ``ids`` that ``rows`` (id, status) do not show succeeded; a job that ended
    otherwise (a status in ``failed``) stops the bench."""
    done = set()
    for job_id, status in rows:
        if status in failed:
            raise RuntimeError(f"{system} job {job_id} ended {status}")
        if status == "succeeded":
            done.add(job_id)
    return [job_id for job_id in ids if job_id not in done]


def wait_for(what: str, predicate: Callable[[], bool], timeout: float,
             every: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


@dataclass
class TierqSide:
    system: Tierq
    database_url: str
    marks: redis.Redis  # the bench Redis, where handlers push their start marks
    sql_polls: int = 0
    redis_polls: int = 0
    client_cpu: ThreadCpu = field(default_factory=ThreadCpu)
    _engine: sa.Engine = field(init=False)
    _conn: sa.Connection = field(init=False)
    _http: httpx.Client = field(init=False)  # kept alive between latency samples
    backend_pid: int = field(init=False)  # the PostgreSQL backend of the bench's own reads

    def __post_init__(self) -> None:
        self._engine = sa.create_engine(self.database_url, isolation_level="AUTOCOMMIT",
                                        poolclass=sa.NullPool)
        self._conn = self._engine.connect()
        self.backend_pid = int(self._conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        self._http = self.system.http(self.system.tenant_keys[0])

    def close(self) -> None:
        self._http.close()
        self._conn.close()
        self._engine.dispose()

    def unfinished(self) -> int:
        """Jobs not yet ended (one SQL transaction, counted)."""
        self.sql_polls += 1
        ended = ", ".join(f"'{status}'" for status in sorted(TERMINAL))
        value = self._conn.exec_driver_sql(
            f"SELECT count(*) FROM jobs WHERE status NOT IN ({ended})").scalar_one()
        return int(value)

    def pending(self, ids: list[str]) -> list[str]:
        """Those of ``ids`` whose result is not stored yet: one read (counted)."""
        self.sql_polls += 1
        rows = self._conn.exec_driver_sql(
            "SELECT id, status FROM jobs WHERE id = ANY(%(ids)s)", {"ids": ids}).all()
        return not_succeeded(ids, rows, failed=TERMINAL - {"succeeded"}, system="tierq")

    def submitter(self, kind: str = "echo", ids: list[str] | None = None,
                  payload: dict[str, Any] | None = None) -> MakeCall:
        """Calls that submit one job each; the payload is ``{"n": n}`` unless given."""
        keys = itertools.cycle(self.system.tenant_keys)
        lock = threading.Lock()

        def make_call() -> Callable[[int], bool]:
            with lock:
                http = self.system.http(next(keys))

            def submit(n: int) -> bool:
                body = {"kind": kind, "payload": {"n": n} if payload is None else payload}
                response = http.post("/v1/jobs", json=body)
                if ids is not None and response.status_code == 202:
                    ids[n] = response.json()["id"]
                return response.status_code == 202

            return submit

        return self.client_cpu.wrap(make_call)

    def end_to_end(self, clients: int, count: int) -> float:
        """Submit ``count`` echo jobs and wait until all succeeded; the wall time from the
        first submit."""
        ids = [""] * count
        began = self._submit_all(clients, count, self.submitter(ids=ids)).began_s
        wait_all(ids, self.pending, 60 + count / 10)
        return time.perf_counter() - began

    def hold_jobs(self, clients: int, count: int, key: str, seconds: float) -> float:
        """Submit ``count`` jobs holding a slot ``seconds`` each; wait until all succeeded.
        When the first submit left (``time.time()``)."""
        ids = [""] * count
        payload = {"key": key, "seconds": seconds}
        figures = self._submit_all(clients, count,
                                   self.submitter("hold", ids=ids, payload=payload))
        wait_all(ids, self.pending, 60 + 2 * count * seconds)
        return figures.began_at

    def _submit_all(self, clients: int, count: int, make_call: MakeCall) -> Figures:
        figures = hammer(clients, count, make_call)
        if figures.done < count:
            raise RuntimeError(f"tierq accepted {figures.done} of {count} jobs")
        return figures

    def hold(self) -> None:
        """Nothing runs while held: the API alone is measured (a submit to a free slot
        leases its job and pushes its message itself, so the worker is paused too, as the
        dispatcher is). (No SQL here: what the bench reads just before a measured phase
        would be counted in it.)"""
        self.system.processes["dispatcher"].pause()
        self.system.processes["worker"].pause()

    def submit_held(self, clients: int, count: int, rate: float | None) -> Figures:
        return (hammer(clients, count, self.submitter()) if rate is None
                else paced(clients, count, rate, self.submitter()))

    def release(self) -> None:
        """Dispatch again, and wait until what was submitted while held has run."""
        self.system.processes["worker"].resume()
        self.system.processes["dispatcher"].resume()
        wait_for("tierq backlog drained", lambda: self.unfinished() == 0, 600, every=0.2)

    def start_latency(self) -> float:
        key, http = f"bench:mark:{uuid.uuid4().hex}", self._http
        submitted = time.time()
        response = http.post("/v1/jobs", json={"kind": "mark", "payload": {"key": key}})
        response.raise_for_status()
        job_id = response.json()["id"]
        started = pop_mark(self.marks, key)
        wait_for("the mark job ended", lambda: _ended(http, job_id), 60)
        time.sleep(IDLE_GAP_S)
        return started - submitted


def _ended(http: httpx.Client, job_id: str) -> bool:
    return http.get(f"/v1/jobs/{job_id}", params={"wait": 5}).json()["status"] in TERMINAL


def pop_mark(client: redis.Redis, key: str) -> float:
    popped = client.blpop([key], timeout=60)
    if popped is None:
        raise TimeoutError("the handler never marked its start")
    return float(popped[1])


@dataclass
class CelerySide:
    redis_url: str
    sql_polls: int = 0
    redis_polls: int = 0
    idle_queue: str = "bare.idle"  # published to while measuring submit alone: not consumed
    client_cpu: ThreadCpu = field(default_factory=ThreadCpu)
    app: Any = field(init=False)
    poll: redis.Redis = field(init=False)  # the bench's own reads: left out of the counts
    poll_address: str = field(init=False)

    def __post_init__(self) -> None:
        self.app = make_app(broker_url(self.redis_url))
        self.app.conf.broker_pool_limit = 16
        self.poll = redis.Redis.from_url(self.redis_url, single_connection_client=True)
        self.poll_address = str(self.poll.client_info()["addr"])

    def close(self) -> None:
        self.poll.close()
        self.app.close()

    def stored(self, task_id: str) -> bool:
        self.redis_polls += 1
        return bool(self.poll.exists(f"celery-task-meta-{task_id}"))

    def pending(self, ids: list[str]) -> list[str]:
        """Those of ``ids`` whose result is not stored yet: one pipelined round trip."""
        self.redis_polls += len(ids)
        with self.poll.pipeline(transaction=False) as pipe:
            for task_id in ids:
                pipe.exists(f"celery-task-meta-{task_id}")
            found = pipe.execute()
        return [task_id for task_id, stored in zip(ids, found, strict=True) if not stored]

    def publisher(self, ids: list[str] | None = None, queue: str | None = None,
                  ignore_result: bool = False, task: str = NOOP,
                  args: list[Any] | None = None) -> MakeCall:
        """Calls that publish one task each; its arguments are ``[n]`` unless given."""
        chosen = self.app.tasks[task]

        def make_call() -> Callable[[int], bool]:
            def publish(n: int) -> bool:
                result = chosen.apply_async(args=[n] if args is None else args, queue=queue,
                                            ignore_result=ignore_result)
                if ids is not None:
                    ids[n] = result.id
                return True

            return publish

        return self.client_cpu.wrap(make_call)

    def end_to_end(self, clients: int, count: int) -> float:
        ids = [""] * count
        began = hammer(clients, count, self.publisher(ids)).began_s
        wait_all(ids, self.pending, 60 + count / 10)
        return time.perf_counter() - began

    def hold_jobs(self, clients: int, count: int, key: str, seconds: float) -> float:
        ids = [""] * count
        figures = hammer(clients, count, self.publisher(ids, task=HOLD, args=[key, seconds]))
        wait_all(ids, self.pending, 60 + 2 * count * seconds)
        return figures.began_at

    def hold(self) -> None:
        pass

    def submit_held(self, clients: int, count: int, rate: float | None) -> Figures:
        make_call = self.publisher(queue=self.idle_queue)
        return (hammer(clients, count, make_call) if rate is None
                else paced(clients, count, rate, make_call))

    def release(self) -> None:
        self.poll.delete(self.idle_queue)
        self.redis_polls += 1

    def start_latency(self) -> float:
        key = f"bench:mark:{uuid.uuid4().hex}"
        submitted = time.time()
        result = self.app.tasks[MARK].apply_async(args=[key])
        started = pop_mark(self.poll, key)
        self.redis_polls += 1
        wait_for("the mark task ended", lambda: self.stored(result.id), 60)
        time.sleep(IDLE_GAP_S)
        return started - submitted
