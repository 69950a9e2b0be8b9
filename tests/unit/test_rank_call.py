"""A call's output wait is paid once: ``RankCall.result()`` reads failures after waiting for
the ranks' output, and ``failures()`` needs that output too.

The stall this guards against comes from ipyparallel (an output message that never
completes, e.g. its IO thread failing on a comm message), which a test cannot provoke on
purpose; the stand-in below is an ``AsyncResult`` with the same ``wait``/``wait_for_output``
contract whose output never completes.
"""

from __future__ import annotations

import threading
import time

import pytest

from workbench.notebook.cluster.rank_call import RankCall

pytestmark = pytest.mark.pure


class _StalledOutput:
    """Done and successful on every rank, but its output never completes."""

    def __init__(self, n: int):
        self._metadata = [{"completed": True, "error": None} for _ in range(n)]
        self._event = threading.Event()
        self.output_waits: list[float] = []

    def wait(self, timeout=None):
        return True

    def ready(self):
        return True

    def successful(self):
        return True

    def get(self):
        return [None] * len(self._metadata)

    def wait_for_output(self, timeout=-1):
        self.output_waits.append(timeout)
        return self._event.wait(timeout)


class _RankSet:
    def dead(self):
        return []


def test_result_waits_for_output_that_never_completes_once():
    ar = _StalledOutput(2)
    call = RankCall(_RankSet(), [0, 1], ar, cell=True)
    call.wait_for_output = _shortened(call.wait_for_output, 0.3)
    t0 = time.monotonic()
    assert call.result() == [None, None]
    took = time.monotonic() - t0
    # one full wait, then only a look: a second 0.3 s wait would take the call past 0.6 s
    assert ar.output_waits == [0.3, 0], ar.output_waits
    assert took < 0.55, took


def test_wait_for_output_reports_whether_output_completed():
    ar = _StalledOutput(1)
    call = RankCall(_RankSet(), [0], ar)
    assert call.wait_for_output(timeout=0.05) is False
    ar._event.set()
    assert call.wait_for_output(timeout=0.05) is True


def _shortened(wait, seconds):
    def shortened(timeout=30.0):
        return wait(timeout=min(timeout, seconds))

    return shortened
