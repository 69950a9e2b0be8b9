"""A call in flight on some ranks (notebook side): waits for per-rank results while
watching for dead ranks, and turns rank-side exceptions into one tagged failure."""

from __future__ import annotations

import time

from ...shared import replies
from ...shared.errors import RankDied, RankFailure
from . import health


class RankCall:
    """A call in flight on some ranks of ``rankset`` (a :class:`RankSet`). ``result()``
    waits, watching for dead ranks."""

    def __init__(self, rankset, ranks: list[int], ar, *, cell: bool = False, fanned=None):
        self.rankset = rankset
        self.ranks = ranks
        self.ar = ar
        # a call through the broadcast tree (``fanout.Coalesced``): one reply for all ranks,
        # each rank's output filed apart
        self.fanned = fanned
        # a cell's error arrives as an output message (its reply is 'ok'), which the reply can overtake
        self.cell = cell
        # the output wait is paid once per call: result() and failures() both need it, and
        # output that did not complete in time will not complete for a second wait either
        self._output_waited = False

    def wait(self, timeout: float | None = None, poll: float = 0.1) -> bool:
        """Wait until done, ``timeout`` passes or a rank dies; True when done.

        After a death the wait ends within half a second (the survivors that notice
        the dead peer at once get that long to report); survivors that are blocked
        in a collective with no direct link to it come out at the collective timeout.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic()))
            if self.ar.wait(step):
                return True
            if self.deaths():
                grace = min(self.rankset.config.timeout, 0.4)
                self.ar.wait(grace)
                return self.ar.ready()
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def deaths(self) -> list[dict]:
        return [d for d in self.rankset.dead() if d["rank"] in self.ranks]

    def result(self, timeout: float | None = None) -> list:
        """Per-rank results in rank order; raises RankDied / RankFailure / TimeoutError."""
        done = self.wait(timeout)
        deaths = [] if done and self.ar.successful() else self.deaths()
        if deaths:
            raise RankDied(health.death_message(deaths), deaths)
        if not done:
            raise TimeoutError(f"ranks {self.pending()} still running after {timeout} s")
        if self.cell or not self.ar.successful():
            # a rank's error is read from its output stream, which the reply can overtake
            self.wait_for_output()
        failures = self.failures()
        if failures:
            raise RankFailure(failure_message(failures), failures)
        if self.fanned is not None:
            return [value for _, _, value in self.fanned.outcomes()]
        results = self.ar.get()
        return list(results) if isinstance(results, list) else [results]

    def wait_for_output(self, timeout: float = 30.0) -> bool:
        """Wait until what the ranks printed or displayed has arrived (the reply to a call
        can overtake its output); a cell whose every rank published nothing needs no wait.
        False when the output did not complete within ``timeout``; waits at most once."""
        if self.fanned is not None:
            if not self.ar.ready():
                return False
            if self._output_waited:
                timeout = 0
            self._output_waited = True
            return self.fanned.output_in(timeout)
        if self.cell and self.ar.ready() and self.ar.successful():
            if all(isinstance(r, replies.CellRun) and r.published == 0 for r in self.ar.get()):
                return True
        if self._output_waited:
            timeout = 0
        self._output_waited = True
        return bool(self.ar.wait_for_output(timeout=timeout))

    def pending(self) -> list[int]:
        if self.fanned is not None:
            # one reply for all: until it is in, a rank is done once its cell's error is in
            if self.ar.ready():
                return []
            return [r for r, m in zip(self.ranks, self.fanned.metadata()) if m.get("error") is None]
        return [r for r, m in zip(self.ranks, self.ar._metadata) if not m.get("completed")]

    def failures(self) -> dict[int, tuple[str, str, str]]:
        """rank -> (exception name, message, remote traceback) for ranks that raised."""
        if self.cell and self.ar.ready() and self.ar.successful():
            self.wait_for_output()  # a cell's error is an output message, which its reply can overtake
        out = {}
        if self.fanned is not None and self.ar.ready() and self.ar.successful():
            for rank, (_, content, _) in zip(self.ranks, self.fanned.outcomes()):
                if content is not None:  # the call raised on that rank
                    from ipyparallel.error import unwrap_exception

                    err = unwrap_exception(content)
                    out[rank] = (err.ename, str(err.evalue), err.traceback or "")
        for rank, md in zip(self.ranks, self._metadata()):
            if rank in out:
                continue
            err = md.get("error")
            if err is not None:
                out[rank] = (
                    getattr(err, "ename", type(err).__name__),
                    str(getattr(err, "evalue", err)),
                    getattr(err, "traceback", "") or "",
                )
        return out

    def per_rank(self, key: str) -> list:
        """stdout / stderr / outputs / execute_result per rank, in rank order."""
        return [md.get(key) for md in self._metadata()]

    def _metadata(self) -> list[dict]:
        return self.fanned.metadata() if self.fanned is not None else self.ar._metadata


def failure_message(failures: dict[int, tuple[str, str, str]]) -> str:
    parts = [f"rank {r}: {ename}: {evalue}" for r, (ename, evalue, _) in sorted(failures.items())]
    return "; ".join(parts)
