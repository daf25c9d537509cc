"""Every period and batch size of the leader's loop, in one place.

The live dispatcher and the simulator read the same figures here, so a simulated round keeps
the rhythm of a real one. Periods are seconds; batches bound each round's work, so no chore
holds up the dispatch that follows it.
"""

# -- the dispatcher's round --------------------------------------------------------------------

# Caps (with the tenants' own, read from SQL), reaping and expiry run together this often
# (and in a leader's first round).
MAINTENANCE_PERIOD_S = 1.0
# A job whose publish failed (broker unreachable) is offered again after this long.
PUBLISH_RETRY_S = 1.0
# A job indexed by an API process whose SQL commit has not landed yet is retried this often
# for ``UNCOMMITTED_GRACE_S``; after that it is a failed submit's leftover.
UNCOMMITTED_RETRY_S = 0.2
# How long such a job is left alone (its id carries its creation time, on the one clock).
UNCOMMITTED_GRACE_S = 30.0
# A worker that meets such a job reads its row again for this long before putting it back:
# the commit follows its index entry by a millisecond or two, and a slot that waits for it
# starts the job at once, where a put-back waits for a dispatcher's round.
UNCOMMITTED_WAIT_S = 1.0
# A submit that finds a slot free has its job leased before its COMMIT, so that the worker
# wakes while the row commits; a worker's start of a job younger than this waits for that
# commit first (PostgreSQL: the job's commit lock), at most UNCOMMITTED_WAIT_S.
COMMITTING_S = 0.25
# The loop's longest wait after a transient error of Redis or SQL.
MAX_BACKOFF_S = 10.0

# -- batches: the feeder -----------------------------------------------------------------------

FEED_PERIOD_S = 0.1
# Batches looked at per round, and items admitted per round in all: bounded upkeep (each
# admit is one Redis round trip, and the round holds up the dispatch that follows it).
BATCHES_PER_ROUND = 50
ITEMS_PER_ROUND = 200

# -- convergence: the reconciler and the full pass ---------------------------------------------

RECONCILE_PERIOD_S = 2.0
# A queued row changed this recently may still be on its way into the index (its writer
# indexes it right after the commit): not a repair yet.
QUEUED_GRACE_S = 10.0
FULL_SWEEP_S = 300.0
IN_FLIGHT_BATCH = 1000
QUEUED_BATCH = 1000
ENTRY_BATCH = 1000
# Rows read, and index entries written, per batch of a full pass.
REBUILD_BATCH = 2000

# -- retention ---------------------------------------------------------------------------------

PRUNE_PERIOD_S = 10.0
PRUNE_BATCH = 1000

# -- the measured service rate -----------------------------------------------------------------

# How often the leader measures the mean service time again.
SERVICE_REFRESH_S = 5.0
# How often it counts the tiers' admissions and the running jobs' ages again: a step in load
# is followed within seconds, not within a refresh of the mean.
ARRIVALS_REFRESH_S = 1.0
# A figure no dispatcher refreshed for this long is dropped: readers fall back to the
# configured mean rather than trust a measure of a pool that may be long gone.
SERVICE_STALE_AFTER_S = 600
