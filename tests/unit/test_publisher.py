"""A rank's event sender against the notebook's real collector (ZMQ over loopback), in one process."""

import threading
import time

import pytest

from workbench.engine.publisher import Publisher
from workbench.notebook.stream.collector import Collector
from workbench.shared import events


def _wakeups(thread) -> int:
    """Voluntary context switches of one thread so far (Linux)."""
    with open(f"/proc/self/task/{thread.native_id}/status") as f:
        return int(next(line for line in f if line.startswith("voluntary_ctxt_switches")).split()[1])


def _count_sleeps(pub) -> list[int]:
    """From now on, count every wait of the sender thread on its two events (a one-item list)."""
    count = [0]
    for event in (pub._wake, pub._hurry):

        def wait(timeout=None, _wait=event.wait):
            count[0] += 1
            return _wait(timeout)

        event.wait = wait  # the same Event objects: emit/flush still wake a wait already begun
    return count


@pytest.fixture
def pair():
    """A collector and a connected sender, past their first message; closed afterwards."""
    collector = Collector()
    pub = Publisher(collector.address, rank=0, key=collector.key)
    try:
        pub.emit(events.log_event(run="warm-up", rank=0, text="warm-up"))
        assert pub.flush(5.0)
        time.sleep(0.2)
        yield collector, pub
    finally:
        pub.close(timeout=2.0)
        collector.close()
    assert not pub._thread.is_alive()


def test_sender_delivers_in_order_and_sleeps_while_idle(pair):
    collector, pub = pair
    before = _wakeups(pub._thread), _wakeups(collector._thread)
    time.sleep(1.0)
    # idle, neither end wakes by itself: the sender once re-checked for close() twice a
    # second (and polled every 20 ms before that), the collector polled ten times a second
    assert (_wakeups(pub._thread) - before[0], _wakeups(collector._thread) - before[1]) == (0, 0)
    for i in range(1, 201):
        pub.emit(events.step_event(run="p", rank=0, step=i, metrics={"loss": 1.0 / i}))
    assert pub.flush(5.0)
    assert collector.store.wait(lambda s: s.last_steps("p") == {0: 200}, 5.0)
    assert [r["step"] for r in collector.store.snapshot_rows("p")] == list(range(1, 201))
    assert (collector.store.gaps, collector.store.duplicates, pub.dropped) == (0, 0, 0)


def test_a_stepping_rank_sends_batches_and_flush_does_not_wait_for_the_window(pair):
    """Events of a rank stepping every 10 ms go out a few per message (each message wakes the
    sender, ZMQ's thread and the notebook's collector on the cores the ranks train on), yet
    ``flush`` sends at once; the notebook end's thread runs at the lower background priority."""
    from workbench.notebook.background import NICE, thread_nice

    collector, pub = pair
    sleeps = _count_sleeps(pub)  # the sender's own waits (context switches also count GIL hand-offs)
    started = time.monotonic()
    for i in range(1, 101):
        pub.emit(events.step_event(run="b", rank=0, step=i, metrics={"loss": 1.0 / i}))
        time.sleep(0.01)
    woke = sleeps[0]
    windows = (time.monotonic() - started) / 0.1  # ~12; more where the sleeps overran (a loaded machine)
    t0 = time.monotonic()
    pub.emit(events.step_event(run="b", rank=0, step=101, metrics={"loss": 0.0}))
    assert pub.flush(5.0)
    took = time.monotonic() - t0
    # a message per 0.1 s window, one wake-up each while the steps go on (+3: the first window
    # and the ends); woken per step it was >= 100, woken by the window's first event as well ~2 a window
    assert woke <= windows + 3, (woke, windows)
    assert took < 0.05, took
    assert collector.store.wait(lambda s: s.last_steps("b") == {0: 101}, 5.0)
    assert [r["step"] for r in collector.store.snapshot_rows("b")] == list(range(1, 102))
    if thread_nice(collector._thread) is not None:  # where the platform lets a thread lower itself
        # the notebook's collector gives way; the rank's sender shares the GIL with training
        baseline = thread_nice(threading.main_thread())
        assert thread_nice(collector._thread) >= NICE and thread_nice(pub._thread) == baseline
