"""A rank's event sender against the notebook's real collector (ZMQ over loopback), in one process."""
import time

from workbench import events
from workbench.engine.publisher import Publisher
from workbench.stream.collector import Collector


def _wakeups(thread) -> int:
    """Voluntary context switches of one thread so far (Linux)."""
    with open(f"/proc/self/task/{thread.native_id}/status") as f:
        return int(next(line for line in f if line.startswith("voluntary_ctxt_switches")).split()[1])


def test_sender_delivers_in_order_and_sleeps_while_idle():
    collector = Collector()
    pub = Publisher(collector.address, rank=0)
    try:
        pub.emit(events.log_event(run="p", rank=0, text="warm-up"))
        assert pub.flush(5.0)
        time.sleep(0.2)
        before = _wakeups(pub._thread)
        time.sleep(1.0)
        # it polled every 20 ms before: 50 wake-ups a second on every idle rank
        assert _wakeups(pub._thread) - before <= 4
        for i in range(1, 201):
            pub.emit(events.step_event(run="p", rank=0, step=i, metrics={"loss": 1.0 / i}))
        assert pub.flush(5.0)
        assert collector.store.wait(lambda s: s.last_steps("p") == {0: 200}, 5.0)
        assert [r["step"] for r in collector.store.snapshot_rows("p")] == list(range(1, 201))
        assert (collector.store.gaps, collector.store.duplicates, pub.dropped) == (0, 0, 0)
    finally:
        pub.close(timeout=2.0)
        collector.close()
    assert not pub._thread.is_alive()
