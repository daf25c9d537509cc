"""``ServerClock``: Redis's time, read once per resync and extrapolated with a monotonic
clock, so the host's wall clock (skewed, stepped) never decides."""

from __future__ import annotations

import threading

import redis

from jobs.index.clock import RETRY_S, ServerClock


class Clocks:
    """A monotonic clock and a server clock the test moves by hand."""

    def __init__(self) -> None:
        self.mono = 100.0
        self.server = 1_800_000_000.0
        self.reads = 0
        self.down = False

    def monotonic(self) -> float:
        return self.mono

    def read_server(self) -> float:
        if self.down:
            raise redis.ConnectionError("down")
        self.reads += 1
        return self.server

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.server += seconds


def test_reads_the_server_once_per_resync_and_extrapolates() -> None:
    c = Clocks()
    clock = ServerClock(c.read_server, resync_s=10, monotonic=c.monotonic, fallback=lambda: 0.0)
    assert clock() == c.server and clock.synced
    c.advance(4.5)
    assert clock() == c.server  # extrapolated: no second read
    assert c.reads == 1
    c.advance(6)
    assert clock() == c.server and c.reads == 2


def test_the_hosts_wall_clock_never_enters() -> None:
    c = Clocks()
    skewed_host = 1_800_000_000.0 - 600  # ten minutes behind
    clock = ServerClock(c.read_server, monotonic=c.monotonic, fallback=lambda: skewed_host)
    assert clock() == c.server


def test_falls_back_to_the_host_until_redis_answers_and_does_not_hammer_it() -> None:
    c = Clocks()
    c.down = True
    host = 1_700_000_000.0
    clock = ServerClock(c.read_server, monotonic=c.monotonic, fallback=lambda: host)
    assert clock() == host and not clock.synced
    c.down = False
    c.advance(RETRY_S / 2)
    assert clock() == host  # not retried yet
    c.advance(RETRY_S)
    assert clock() == c.server and c.reads == 1


def test_keeps_the_last_offset_while_redis_is_down() -> None:
    c = Clocks()
    clock = ServerClock(c.read_server, resync_s=1, monotonic=c.monotonic, fallback=lambda: 0.0)
    clock()
    c.down = True
    c.advance(30)
    assert clock() == c.server


def test_while_one_caller_measures_the_others_do_not_wait() -> None:
    c = Clocks()
    started, release = threading.Event(), threading.Event()

    def slow_read() -> float:
        started.set()
        release.wait(5)
        return c.read_server()

    clock = ServerClock(slow_read, monotonic=c.monotonic, fallback=lambda: 42.0)
    measuring = threading.Thread(target=clock)
    measuring.start()
    assert started.wait(5)
    assert clock() == 42.0  # at once, from the fallback (no offset yet)
    release.set()
    measuring.join(5)
    assert clock() == c.server


class RoundTrips(Clocks):
    """Each read takes ``rtt`` seconds; the server reads its clock ``read_at`` into it (the
    middle is what the clock assumes: anything else is an error of up to half the trip)."""

    def __init__(self) -> None:
        super().__init__()
        self.rtt = 0.0
        self.read_at = 0.0

    def read_server(self) -> float:
        self.reads += 1
        self.advance(self.read_at)
        seen = self.server
        self.advance(self.rtt - self.read_at)
        return seen


def test_a_slow_reading_does_not_replace_a_sharper_one() -> None:
    c = RoundTrips()
    clock = ServerClock(c.read_server, resync_s=1, monotonic=c.monotonic, fallback=lambda: 0.0)
    c.rtt, c.read_at = 0.001, 0.0005
    assert abs(clock() - c.server) < 1e-9
    # A loaded host: a 40 ms round trip, the server answering at its very start (20 ms off
    # by the middle rule). The sharp offset stays.
    c.advance(1.5)
    c.rtt, c.read_at = 0.040, 0.0
    assert abs(clock() - c.server) < 1e-9 and c.reads == 2


def test_a_sharp_reading_replaces_a_slow_one() -> None:
    c = RoundTrips()
    clock = ServerClock(c.read_server, resync_s=1, monotonic=c.monotonic, fallback=lambda: 0.0)
    c.rtt, c.read_at = 0.040, 0.0
    assert abs(clock() - c.server + 0.020) < 1e-6  # the first reading is all there is
    c.advance(1.5)
    c.rtt, c.read_at = 0.001, 0.0005
    assert abs(clock() - c.server) < 1e-9


def test_a_reading_that_cannot_agree_with_the_held_one_wins() -> None:
    # The server's clock moved (Redis failed over to a host a second ahead): the sharper
    # old offset is wrong, and the new one, however slow its trip, is taken.
    c = RoundTrips()
    clock = ServerClock(c.read_server, resync_s=1, monotonic=c.monotonic, fallback=lambda: 0.0)
    c.rtt, c.read_at = 0.001, 0.0005
    clock()
    c.advance(1.5)
    c.server += 1.0
    c.rtt, c.read_at = 0.040, 0.020
    assert abs(clock() - c.server) < 1e-9


def test_an_old_sharp_reading_gives_way_as_its_drift_grows() -> None:
    c = RoundTrips()
    clock = ServerClock(c.read_server, resync_s=10, monotonic=c.monotonic, fallback=lambda: 0.0)
    c.rtt, c.read_at = 0.001, 0.0005
    clock()
    c.advance(3600)  # an hour later, the held reading is ±0.36 s by the drift allowed
    c.rtt, c.read_at = 0.010, 0.004  # a 10 ms trip, answered 1 ms before its middle
    assert abs(clock() - (c.server - 0.001)) < 1e-6  # taken: ±5 ms beats ±0.36 s
