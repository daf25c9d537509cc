"""The names of the dispatch index's Redis keys: the one module that spells them.

Every key starts with one prefix that carries one hash tag (``{tierq}:``), so all keys sit in
one cluster slot. Fixed keys are passed to the Lua scripts through ``KEYS[]`` in the order of
``IndexKeys.fixed()``; keys discovered while a script runs (a tenant's queue) are derived from
the prefix (``KEYS[1]``) with the same suffixes as below, spelled once more in
``lua/common.lua``.

Pools (``jobs.core.pools``): each pool's keys below live under its own prefix (the default
pool's is the root prefix itself, ``{tierq}:pool:<name>:`` for another), except the leader
lock and its epoch, the ``rate:<tenant>`` buckets and the ``tenants`` channel, which are the
fleet's and stay under the root prefix whatever the pool.

Layout (a job is in exactly one of queued, delayed or leased while the index knows it; a
queued job's id is in its tenant's queue and its tier's, and has a ``meta`` entry only when
its attempt is not the first or it has a ``start_by``):

- ``queue:<tenant>``   list of job ids: the tenant's queued jobs in dispatch order (order
                       key, ties by id), head first; their order keys are in their tiers'
- ``lease:<tenant>``   zset job -> expires_at: the tenant's in-flight leases
- ``tier:<tier>``      zset job -> order_key: the tier's queued jobs, the one place a
                       queued job's order key is kept; a position is the sum over the tiers
                       of the jobs ahead (ties by job id)
- ``tier_delayed``     hash tier -> count of its delayed jobs; its fields name every tier
                       that held a job (the tiers a position sums over)
- ``runnable_tenants`` zset ``head job \\0 tenant`` -> the head's order_key: tenants with
                       queued work under their cap, each filed under its head job (so ties
                       go by job id, as positions do)
- ``blocked_tenants``  zset, the same: tenants at their cap with queued work
- ``delayed``          zset job -> not_before: jobs waiting out a retry backoff
- ``deadlines``        zset job -> start_by: queued and delayed jobs that can expire
- ``leases``           zset job -> expires_at: every lease (the reaper's view)
- ``ending``           set of jobs: leases kept by a slot that passed itself on before its
                       ending was committed (``hand_over`` with ``keep``): held until
                       released, but holding no slot of the pool (``lua/common.lua``)
- ``riders``           set of jobs: leases of a run's items after its first (``fill_run``):
                       the run holds one slot, so these hold none
- ``hist:run_items:<kind>``, ``run_kinds``, ``counters:items_started``,
  ``items_started:<slot>``: runs recorded by workers (``jobs.index.counters.record_run``)
- ``meta``             hash job -> JSON [tenant, tier, order_key, start_by, not_before,
                       attempt(, cancel)]: every lease and delayed job, and a queued job
                       whose attempt is not the first or that has a start_by; the attempt
                       its entry or lease belongs to (a queued job without one: attempt 1)
- ``tier_caps``        hash tier -> cap;  ``tenant_caps``: hash tenant -> cap override
- ``tenant_tier``      hash tenant -> the tier last seen for it
- ``tenant_delayed``   hash tenant -> count of its delayed jobs
- ``workers``          zset worker -> expires_at;  ``worker_slots``: hash worker -> slots
                       (and ``worker#device``, ``worker#memory``, ``worker#kinds``: the
                       kinds it runs, a sorted JSON array, '' when it said none)
- ``kinds``            string: the kinds every live worker registered, while they are the
                       same (``register_worker``: another worker's unlike them routes)
- ``routed``           string, set while the pool is routed by kind
                       (``jobs.index.worker_registry``): only the dispatcher leases
- ``kinds_waiting``    set of kinds met that some live worker did not run
- ``parked:<kind>``    set of job ids: jobs of a kind no live worker ran, put back delayed
                       until one registers (``route_kinds`` makes them due at once then)
- ``leader``           string: the leading dispatcher's fencing token, with a TTL
- ``leader_epoch``     counter: incremented on every acquisition of ``leader``
- ``generation``       string: the epoch the reconciler keeps equal to SQL's; gone, Redis
                       lost its data; older than SQL's, Redis came back from a snapshot
- ``rate:<tenant>``    hash tokens, at: the tenant's request-rate token bucket
- ``service_mean``     hash mean_s, samples, at: the measured mean service time
- ``arrivals``         hash tier -> "rate mean": jobs/s admitted over the span since the
                       rate last changed (at most ``policy.arrivals_window_s``) and their
                       kinds' mean service time; running_s: the running jobs' mean; at:
                       when measured (``jobs.fleet.arrivals``)
- ``kind_means``       hash kind -> "mean spread samples": each kind's measured service time
                       (``jobs.core.service_times``)
- ``wake``             list: the dispatcher's doorbell (a few tokens at most)
- ``tier_push``        string: JSON, the broker message envelope and each tier's queue, for
                       a submit that leases and pushes its job itself (``offer``)
- ``counters:leases_reclaimed``  counter: leases the reaper took back
- ``refusals:<minute>``  hash JSON [scope, tier or tenant, reason] -> count: the refusals
                       ``admit_new`` made in one minute of the epoch, kept ten minutes
- ``counters:jobs``    hash status -> jobs that entered it (``jobs.index.counters``)
- ``counters:rejections``  hash ``tier|cause|limit`` -> submissions refused with a 429
- ``counters:repairs`` hash kind -> the reconciler's repairs
- ``jobs_live``        hash status -> jobs in it (queued, dispatched, running): the leader's
                       count, refreshed every reconciler period
- ``hist:wait:<tier>`` hash bucket (``le``) -> starts whose queue wait fell in it (not
                       cumulative), ``sum`` -> their total wait: the queue wait histogram
- ``hist:dispatch:<tier>``  the same for dispatch latency (dispatched -> started)
- ``recent_waits:<tier>``  zset ``wait|job`` -> start time: the tier's latest waits, for the
                       windowed percentiles of ``/v1/queues``
- ``progress:<job>``   string: JSON, the job's last progress report while it runs (a day's
                       TTL; the last one is stored in SQL with the ending)

Three pub/sub channels share the prefix (channels, not keys: nothing stores them):
``changed`` carries ids of jobs whose status moved, ``progressed`` ids of jobs that reported
progress, ``tenants`` ids of tenants whose record changed (``jobs.index.notify``).

Celery's broker keys live under the same prefix (kombu's ``global_keyprefix``), so nothing
may delete every key under it while the system runs.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "{tierq}:"

# Due delayed jobs moved into their tenants' queues by one dispatch call, at most.
PROMOTE_LIMIT = 1000


@dataclass(frozen=True)
class IndexKeys:
    """``prefix``: the pool's (``jobs.core.pools.pool_prefix``); ``root``: the deployment's,
    under which the fleet's keys live whatever the pool (the leader lock and its epoch, the
    tenants' rate buckets, the tenants channel). None: the pool is the root's own."""

    prefix: str
    root: str | None = None

    @property
    def base(self) -> str:
        return self.prefix if self.root is None else self.root

    def tenant_queue(self, tenant: str) -> str:
        return f"{self.prefix}queue:{tenant}"

    def tenant_leases(self, tenant: str) -> str:
        return f"{self.prefix}lease:{tenant}"

    def tier(self, tier: str) -> str:
        return f"{self.prefix}tier:{tier}"

    def rate_bucket(self, tenant: str) -> str:
        return f"{self.base}rate:{tenant}"

    def _fixed(self, name: str) -> str:
        return f"{self.prefix}{name}"

    @property
    def tier_delayed(self) -> str:
        return self._fixed("tier_delayed")

    @property
    def meta(self) -> str:
        return self._fixed("meta")

    @property
    def delayed(self) -> str:
        return self._fixed("delayed")

    @property
    def leases(self) -> str:
        return self._fixed("leases")

    @property
    def tenant_delayed(self) -> str:
        return self._fixed("tenant_delayed")

    @property
    def service_mean(self) -> str:
        return self._fixed("service_mean")

    @property
    def arrivals(self) -> str:
        return self._fixed("arrivals")

    @property
    def kind_means(self) -> str:
        return self._fixed("kind_means")

    @property
    def tier_push(self) -> str:
        """How a submit's ``offer`` pushes a message to a tier's broker queue: JSON
        (``jobs.index.values.TierPush``), set by the workers whose broker is this Redis."""
        return self._fixed("tier_push")

    @property
    def doorbell(self) -> str:
        """A short list: a token here wakes the dispatcher (``jobs.index.wake``)."""
        return self._fixed("wake")

    @property
    def leases_reclaimed(self) -> str:
        """Counter of leases the reaper took back (``jobs.index.counters``)."""
        return self._fixed("counters:leases_reclaimed")

    def refusals(self, minute: int) -> str:
        """The refusals ``admit_new`` counted in one minute (``base.refusal_minute``)."""
        return self._fixed(f"refusals:{minute}")

    @property
    def job_counts(self) -> str:
        """Hash status -> jobs that entered it (``jobs.index.counters``)."""
        return self._fixed("counters:jobs")

    @property
    def rejections(self) -> str:
        """Hash ``tier|cause|limit`` -> refusals (``jobs.index.counters``)."""
        return self._fixed("counters:rejections")

    @property
    def repairs(self) -> str:
        """Hash kind -> the reconciler's repairs (``jobs.index.counters``)."""
        return self._fixed("counters:repairs")

    @property
    def live_jobs(self) -> str:
        """Hash status -> jobs in each live state, the leader's snapshot (``index.counters``)."""
        return self._fixed("jobs_live")

    def wait_histogram(self, tier: str) -> str:
        return f"{self.prefix}hist:wait:{tier}"

    def dispatch_histogram(self, tier: str) -> str:
        return f"{self.prefix}hist:dispatch:{tier}"

    def recent_waits(self, tier: str) -> str:
        return f"{self.prefix}recent_waits:{tier}"

    def progress(self, job_id: str) -> str:
        """A running job's last progress report (JSON, ``jobs.index.progress``)."""
        return f"{self.prefix}progress:{job_id}"

    @property
    def progress_reported(self) -> str:
        """Pub/sub channel: ids of jobs that reported progress (``jobs.index.progress``)."""
        return self._fixed("progressed")

    @property
    def changed(self) -> str:
        """Pub/sub channel: ids of jobs whose status moved (``jobs.index.notify``)."""
        return self._fixed("changed")

    @property
    def tenants_changed(self) -> str:
        """Pub/sub channel: ids of tenants whose record changed (``jobs.index.notify``)."""
        return f"{self.base}tenants"

    @property
    def leader(self) -> str:
        return f"{self.base}leader"

    @property
    def leader_epoch(self) -> str:
        return f"{self.base}leader_epoch"

    @property
    def generation(self) -> str:
        return self._fixed("generation")

    def fixed(self) -> list[str]:
        """``KEYS[]`` of the index scripts, in the order ``lua/common.lua`` reads them."""
        names = (
            "runnable_tenants", "blocked_tenants", "tier_delayed", "delayed", "deadlines", "leases",
            "meta", "tier_caps", "tenant_caps", "tenant_tier", "tenant_delayed",
        )
        return [self.prefix, *(self._fixed(name) for name in names)]

    def fenced(self) -> list[str]:
        """``KEYS[]`` of the index scripts: ``fixed()``, then the leader lock whose token a
        fenced call checks."""
        return [*self.fixed(), self.leader]

    def leader_keys(self) -> list[str]:
        """``KEYS[]`` of the leadership scripts: the lock and its epoch counter."""
        return [self.leader, self.leader_epoch]

    def worker_keys(self) -> list[str]:
        """``KEYS[]`` of the worker scripts: the registrations and their slots."""
        return [self._fixed("workers"), self._fixed("worker_slots")]

    @property
    def shared_kinds(self) -> str:
        """The kinds every live worker registered, while they are the same."""
        return self._fixed("kinds")

    @property
    def routed(self) -> str:
        """Set while the pool is routed by kind (``jobs.index.worker_registry``)."""
        return self._fixed("routed")

    @property
    def kinds_waiting(self) -> str:
        """Set of the kinds met that some live worker did not run."""
        return self._fixed("kinds_waiting")

    def glob(self) -> str:
        """A SCAN pattern matching every key under the prefix (glob characters escaped)."""
        escaped = "".join(f"\\{c}" if c in "*?[]\\" else c for c in self.prefix)
        return f"{escaped}*"
