"""Calls that fan out to the ranks through the controller's broadcast tree (notebook side).

A direct view sends one request per rank and takes one reply per rank, each signed, sent,
received and parsed here, and the busy/idle status of every rank on top: the notebook's work per
cell grows with the rank count. Through ipyparallel's broadcast scheduler the notebook sends one
request, the tree of schedulers sends it on to the ranks, and with ``is_coalescing`` the tree
gathers the replies into one message. The ranks send no status for such a call
(``workbench.engine.fanout``); their output still comes per rank on IOPub, filed under
``<request id>_<engine uuid>``, and a rank that published anything ends it with a marker.
"""

from __future__ import annotations

import time

from ...engine import fanout as rank_fanout

FANOUT_FROM = 8  # ranks; fewer go through a direct view (its figures on 4 ranks are the benchmark's)
OUTPUT_POLL_S = 0.002


def view(client, engine_ids: list[int]):
    """A coalescing broadcast view on ``engine_ids``."""
    return client.broadcast_view(engine_ids, is_coalescing=True)


def submit(bview, fn, args, kwargs):
    """``fn`` on every engine of ``bview``, wrapped so that it never raises there."""
    return bview.apply_async(rank_fanout.run, fn, *args, **kwargs)


class Coalesced:
    """The per-rank side of one coalesced call: outcomes in rank order, each rank's output."""

    def __init__(self, client, ar, engine_ids: list[int]):
        self.client = client
        self.ar = ar
        self.engine_ids = engine_ids
        uuids = [client._engines[e] for e in engine_ids]
        msg_id = ar.msg_ids[0]
        self._output_ids = [f"{msg_id}_{u}" for u in uuids]
        self._outcomes: list[tuple] | None = None

    def outcomes(self) -> list[tuple]:
        """``(published, error content, value)`` per rank, in rank order, once the reply is in."""
        if self._outcomes is None:
            flat = self.ar.get()
            order = self.ar._metadata[0]["engine_id"]  # the tree's order: by scheduler, then target
            by_engine = dict(zip(order, flat))
            self._outcomes = [by_engine[e] for e in self.engine_ids]
        return self._outcomes

    def metadata(self) -> list[dict]:
        """Each rank's output so far (stdout, stderr, outputs, execute_result, error, data)."""
        md = self.client.metadata
        return [md.get(i) or {} for i in self._output_ids]

    def output_in(self, timeout: float) -> bool:
        """Wait until every rank that published something has sent its end-of-output marker."""
        waiting = [i for i, (published, _, _) in zip(self._output_ids, self.outcomes()) if published != 0]
        deadline = time.monotonic() + timeout
        md = self.client.metadata
        while waiting:
            waiting = [i for i in waiting if rank_fanout.OUTPUT_DONE not in ((md.get(i) or {}).get("data") or {})]
            if not waiting:
                break
            if time.monotonic() >= deadline:
                return False
            time.sleep(OUTPUT_POLL_S)
        return True
