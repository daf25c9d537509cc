"""The packing bench's two measured runs, each done once with packing off and once on.

- ``evaluation``: a batch of ``eval.similarity`` items (one sentence pair each, every
  sentence of the run a different one, so that a run's shared embedding of a sentence
  several items hold saves nothing) on the real model, beside a premium tenant's single
  jobs submitted every ``--premium-every`` seconds while the batch runs: the batch's items
  per second, and each single job's wait (``started_at − enqueued_at``).
- ``gpu_like``: a batch of ``bench.pack`` items (``packing_handlers``: a run holds its slot
  ``a + b × n`` s, asleep): the CPU seconds of tierq's API, dispatcher and worker per item,
  and the SQL transactions per item (``pg_stat_database``, as ``e2e_meters`` reads it).

Both read their figures from the jobs' rows (one host: Redis's clock, which stamps them,
is this one's), through a connection of the bench's own whose reads are counted and taken
off the SQL figure.
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from e2e_meters import CpuMeter, SqlMeter
from packing_stack import BULK, PREMIUM, Stack

EVAL = "eval.similarity"
TERMINAL = ("succeeded", "failed", "cancelled", "expired")
_ADJECTIVES = ("small", "quiet", "red", "old", "bright", "lazy", "young", "tall", "gentle",
               "noisy", "clever", "tired", "happy", "cold", "brave", "shy", "wild", "calm",
               "busy", "proud")
_SUBJECTS = ("cat", "dog", "child", "farmer", "pilot", "teacher", "horse", "bird", "doctor",
             "sailor", "painter", "baker", "student", "fox", "robot", "singer", "judge",
             "runner", "monk", "crow")
_VERBS = ("sits", "runs", "waits", "sleeps", "reads", "sings", "works", "plays", "walks",
          "dances", "cooks", "writes", "hides", "swims", "climbs", "talks", "laughs",
          "rests", "paints", "listens")
_PLACES = ("in the garden", "by the river", "on the roof", "near the station",
           "under the bridge", "at the market", "in the kitchen", "on the hill",
           "behind the school", "at the harbour", "in the forest", "on the beach",
           "in the library", "at the corner", "by the window", "in the field", "on the train",
           "at the museum", "near the lake", "in the square")


def sentences(count: int, seed: int) -> Iterator[str]:
    """``count`` different short sentences (160,000 to draw from), in a seeded order."""
    parts = (_ADJECTIVES, _SUBJECTS, _VERBS, _PLACES)
    total = 1
    for words in parts:
        total *= len(words)
    for n in random.Random(seed).sample(range(total), count):
        chosen = []
        for words in parts:
            n, i = divmod(n, len(words))
            chosen.append(words[i])
        yield "a {} {} {} {}".format(*chosen)


def eval_payloads(count: int, seed: int) -> list[dict[str, Any]]:
    said = sentences(2 * count, seed)
    labels = random.Random(seed + 1)
    return [{"pairs": [[next(said), next(said)]], "labels": [round(labels.random(), 3)]}
            for _ in range(count)]


@dataclass
class Rows:
    """The bench's own reads of the jobs' rows (each counted: one transaction)."""

    engine: sa.Engine
    reads: int = 0

    def batch(self, batch_id: str) -> dict[str, Any]:
        """Its items: how many ended, how many succeeded, the first start, the last end
        (epoch s) and the mean items per run."""
        self.reads += 1
        with self.engine.connect() as conn:
            row = conn.execute(sa.text(
                "SELECT count(*) FILTER (WHERE status IN ('succeeded', 'failed', 'cancelled',"
                " 'expired')) AS ended, count(*) FILTER (WHERE status = 'succeeded') AS ok, "
                "extract(epoch FROM min(started_at)) AS first_start, "
                "extract(epoch FROM max(finished_at)) AS last_end, "
                "avg(coalesce(run_items, 1)) AS run_items "
                "FROM jobs WHERE batch_id = :b"), {"b": batch_id}).mappings().one()
        return dict(row)

    def last_end(self, batch_id: str, leaving_out: list[str]) -> float:
        """The batch's last end (epoch s), ``leaving_out`` those items."""
        self.reads += 1
        with self.engine.connect() as conn:
            value = conn.execute(sa.text(
                "SELECT extract(epoch FROM max(finished_at)) FROM jobs WHERE batch_id = :b "
                "AND NOT id = ANY(:ids)"), {"b": batch_id, "ids": leaving_out}).scalar_one()
        return float(value)

    def count(self, batch_id: str, ids: list[str]) -> int:
        """How many of ``ids`` are the batch's items."""
        self.reads += 1
        with self.engine.connect() as conn:
            return int(conn.execute(sa.text(
                "SELECT count(*) FROM jobs WHERE batch_id = :b AND id = ANY(:ids)"),
                {"b": batch_id, "ids": ids}).scalar_one())

    def wait_batch(self, batch_id: str, total: int, timeout: float,
                   every: float = 0.2) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (state := self.batch(batch_id))["ended"] < total:
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch {batch_id}: {state['ended']} of {total} ended")
            time.sleep(every)
        if state["ok"] != total:
            raise RuntimeError(f"batch {batch_id}: {state['ok']} of {total} succeeded")
        return state

    def singles(self, ids: list[str], timeout: float = 120) -> list[dict[str, Any]]:
        """The single jobs' waits and run times (s) and run sizes, once every one ended."""
        deadline = time.monotonic() + timeout
        while True:
            self.reads += 1
            with self.engine.connect() as conn:
                rows = conn.execute(sa.text(
                    "SELECT id, status, extract(epoch FROM started_at - enqueued_at) AS wait, "
                    "extract(epoch FROM finished_at - started_at) AS run, "
                    "coalesce(run_items, 1) AS run_items FROM jobs WHERE id = ANY(:ids)"),
                    {"ids": ids}).mappings().all()
            if len(rows) == len(ids) and all(r["status"] in TERMINAL for r in rows):
                return [dict(r) for r in rows]
            if time.monotonic() > deadline:
                raise TimeoutError("premium jobs not ended")
            time.sleep(0.2)


def upload(http: httpx.Client, kind: str, payloads: list[dict[str, Any]]) -> str:
    """One NDJSON ``POST /v1/batches``, as an evaluation run is sent; the batch's id."""
    body = b"".join(json.dumps(p, separators=(",", ":")).encode() + b"\n" for p in payloads)
    answer = http.post("/v1/batches", params={"kind": kind}, content=body,
                       headers={"Content-Type": "application/x-ndjson"})
    answer.raise_for_status()
    batch_id: str = answer.json()["id"]
    return batch_id


@dataclass
class Premium:
    """A premium tenant's single jobs, one every ``every`` s (open loop) until stopped."""

    http: httpx.Client
    every: float
    seed: int
    ids: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Premium:
        self._thread = threading.Thread(target=self._submit, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _submit(self) -> None:
        said = sentences(4000, self.seed)
        began = time.monotonic()
        for n in itertools.count():
            if self._stop.wait(max(0.0, began + n * self.every - time.monotonic())):
                return
            payload = {"pairs": [[next(said), next(said)]], "labels": [0.5]}
            answer = self.http.post("/v1/jobs", json={"kind": EVAL, "payload": payload})
            answer.raise_for_status()
            self.ids.append(answer.json()["id"])


def reindexed(log: Path, offset: int) -> list[str]:
    """Jobs the reconciler indexed again (``job.reindexed``) since ``offset`` of the
    dispatcher's log: queued rows the index had lost, each of which waited for it."""
    with log.open("rb") as lines:
        lines.seek(offset)
        return [json.loads(line)["job_id"] for line in lines if b'"job.reindexed"' in line]


@dataclass(frozen=True, kw_only=True)
class EvalFigures:
    items: int
    items_per_s: float
    # The batch's items that waited for the reconciler, and the rate of the others.
    reindexed: int
    items_per_s_others: float
    worker_cpu_ms: float  # the worker's CPU per item, the model's included
    run_items: float  # mean items per run of the batch's items
    waits_s: list[float]  # the premium single jobs'
    runs_s: list[float]  # theirs, started → finished: a run they lead is as long as its items'
    premium_run_items: float

    def wait_p(self, q: int) -> float:
        return percentile(self.waits_s, q)


def percentile(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def evaluation(stack: Stack, rows: Rows, cpu: CpuMeter, *, items: int,
               premium_every: float, seed: int) -> EvalFigures:
    """One evaluation batch beside the premium single jobs; the worker is up and warm."""
    payloads = eval_payloads(items, seed)
    log = stack.processes["dispatcher"].log
    offset = log.stat().st_size
    with stack.http(BULK, timeout=300) as bulk, stack.http(PREMIUM) as premium:
        cpu.start()
        began = time.time()
        batch_id = upload(bulk, EVAL, payloads)
        with Premium(premium, premium_every, seed + 7) as singles:
            state = rows.wait_batch(batch_id, items, timeout=60 + items)
        spent = cpu.stop()
        ended = rows.singles(singles.ids)
    late = reindexed(log, offset)
    others = rows.last_end(batch_id, late) if late else float(state["last_end"])
    late_items = int(rows.count(batch_id, late)) if late else 0
    return EvalFigures(items=items, items_per_s=items / (float(state["last_end"]) - began),
                       reindexed=late_items,
                       items_per_s_others=(items - late_items) / (others - began),
                       worker_cpu_ms=1000 * spent["worker"] / items,
                       run_items=float(state["run_items"]),
                       waits_s=[float(r["wait"]) for r in ended],
                       runs_s=[float(r["run"]) for r in ended],
                       premium_run_items=statistics.fmean(r["run_items"] for r in ended))


def warm(stack: Stack, rows: Rows, kind: str, payloads: list[dict[str, Any]]) -> None:
    """A small batch first: connections, caches and the model's first passes are not what
    is measured."""
    with stack.http(BULK) as bulk:
        rows.wait_batch(upload(bulk, kind, payloads), len(payloads), timeout=120)


@dataclass(frozen=True, kw_only=True)
class GpuFigures:
    items: int
    wall_s: float
    cpu_s: dict[str, float]  # by process: api, dispatcher, worker, postgres, redis-server
    sql: float  # transactions, the bench's reads and the idle trickle taken off
    trickle: float  # the idle trickle taken off
    run_items: float

    def cpu_ms_per_item(self, *names: str) -> float:
        return 1000 * sum(self.cpu_s[n] for n in names) / self.items


def gpu_like(stack: Stack, rows: Rows, sql: SqlMeter, cpu: CpuMeter, *, items: int,
             quiet_since: float) -> GpuFigures:
    """One ``bench.pack`` batch, metered: CPU from upload to its last item's end, SQL
    transactions from before the upload until the backends flushed what it cost."""
    payloads = [{"i": i} for i in range(items)]
    with stack.http(BULK, timeout=300) as bulk:
        before = sql.flushed(quiet_since)
        reads = rows.reads
        counted_from = time.monotonic()
        cpu.start()
        began = time.time()
        batch_id = upload(bulk, "bench.pack", payloads)
        state = rows.wait_batch(batch_id, items, timeout=60 + items, every=0.25)
        spent = cpu.stop()
        ended = time.monotonic()
    after = sql.flushed(ended)
    trickle = sql.idle_per_s * (time.monotonic() - counted_from)
    return GpuFigures(items=items, wall_s=float(state["last_end"]) - began, cpu_s=spent,
                      sql=after - before - (rows.reads - reads) - trickle, trickle=trickle,
                      run_items=float(state["run_items"]))
