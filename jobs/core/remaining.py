"""What a running job still has to run, from what it has run already and its kind's measure.

A blanket mean tells a tenant whose 25 s job has run 20 s that its slot frees in 25 s, and one
whose job has overrun its kind's time that it frees in 25 s again. Each running job is
modelled instead by its kind's mean and spread (``jobs.core.service_times.KindMean``): a
certain part, then a memoryless tail as long as the spread. A kind as variable as an
exponential one (spread at least its mean; any kind not measured yet) is all tail, which is
the memoryless model the estimates used before: its elapsed time tells nothing until it has
run twice its mean. A kind
that runs as long every time is all certain part: 20 s into 25, 5 s are left. A job that has
run past its mean by more than its kind's rest would still allow is one the measure does not
describe (a larger input, a slow device): it is expected to run on as long as it has
overrun, neither nearly done nor fresh.

The first of several running jobs to end (the slot a queued job waits for) ends at the least
of their remaining times: ``first_end_s`` is its expectation, exact for this model; with
every job all tail it is ``1 / Σ 1 / tail``, the sum of their rates as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

# A running job's expected rest, ``(certain_s, tail_s)``: ``certain_s`` it runs for sure,
# then a memoryless tail of mean ``tail_s`` (0: it ends exactly then). A plain pair: one is
# made per running job each time the leader counts them, and per submit of a tenant at its
# cap.
Rest = tuple[float, float]


def remaining(mean_s: float, spread_s: float | None, elapsed_s: float) -> Rest:
    """The rest of a job of a kind of ``mean_s`` and ``spread_s`` (None: not measured, taken
    as memoryless) that has run ``elapsed_s``: its mean less what it has run, at least one
    tail; past that, what it has overrun its mean by."""
    mean = mean_s if mean_s > 0 else 0.0
    if spread_s is None or spread_s >= mean:
        tail = mean
    else:
        tail = spread_s if spread_s > 0 else 0.0
    ran = elapsed_s if elapsed_s > 0 else 0.0
    certain = mean - tail - ran
    if certain < 0:
        certain = 0.0
    overrun = ran - mean
    if overrun > certain + tail:
        return (0.0, overrun)
    return (certain, tail)


def fresh(mean_s: float) -> Rest:
    """A job that starts now and whose kind is not known: memoryless at ``mean_s``."""
    return (0.0, max(0.0, mean_s))


def first_end_s(running: Iterable[Rest]) -> float:
    """The expected time until the first of ``running`` ends: ``∫ Π P(R_i > t) dt``, each
    survival 1 until its certain part is done, then falling at the rate of its tail. The
    integral is taken piece by piece between the certain parts' ends (sorted), where the
    survival of the whole falls at the sum of the rates of the tails begun. Infinite when
    nothing runs."""
    jobs = sorted(running)  # by certain part
    if not jobs:
        return math.inf
    expected, alive, rate, at = 0.0, 1.0, 0.0, 0.0
    exp = math.exp
    for certain, tail in jobs:
        span = certain - at
        if span > 0:
            if rate > 0:
                falls = exp(-rate * span)
                expected += alive * (1.0 - falls) / rate
                alive *= falls
            else:
                expected += alive * span
            at = certain
        if tail <= 0:  # it ends exactly now: nothing outlives this moment
            return expected
        rate += 1.0 / tail
        if alive <= 1e-12:
            return expected
    return expected + alive / rate


def own_slot_s(
    running: Sequence[Rest], *, holds: int, cap: int, fresh_mean_s: float
) -> float:
    """When a tenant holding ``holds`` slots under its ``cap`` first has one of them free:
    the first end among its running jobs (``running`` as last read; those beyond ``holds``,
    the shortest, have ended since, and jobs started since count fresh at ``fresh_mean_s``)
    and, below its cap, the own queued jobs that start at once on the places it has left.
    """
    held = max(0, holds)
    rests = list(running)
    if len(rests) > held:  # the shortest have ended since they were read
        rests = sorted(rests, key=sum)[len(rests) - held:]
    rests += [fresh(fresh_mean_s)] * (held - len(rests) + max(0, cap - held))
    return first_end_s(rests)
