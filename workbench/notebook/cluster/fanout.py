"""Calls that fan out to the ranks through the controller's broadcast tree (notebook side).

A direct view costs the notebook a request, a reply and a busy/idle status per rank. Through
the broadcast tree it sends one request and, with ``is_coalescing``, takes one reply, each
distinct reply once (``controller_process`` merges them by content on the way up); the ranks
send no status (``rpc.fanned``). Their output still comes per rank on IOPub, filed under
``<request id>_<engine uuid>``, and a rank that published anything ends it with a marker.
"""

from __future__ import annotations

import time
import weakref
from types import MappingProxyType

from ...engine import rpc
from ...shared.wire import OUTPUT_DONE

COALESCED = "_workbench_coalesced"  # a merged reply's header (controller_process.merge_replies)
FANOUT_FROM = 8  # ranks; fewer go through a direct view (its figures on 4 ranks are the benchmark's)
OUTPUT_POLL_S = 0.002


NO_OUTPUT = MappingProxyType({})  # a rank that sent nothing for a call (read only, shared)


def view(client, engine_ids: list[int]):
    """A coalescing broadcast view on ``engine_ids``."""
    _remember_targets(client)
    return client.broadcast_view(engine_ids, is_coalescing=True)


def _remember_targets(client) -> None:
    """A view turns its engine ids into the engines' identities on every call, each through the
    client's traits (a cost per rank on every call): remembered per target list while the
    registered engines stay the same."""
    if getattr(client, "_workbench_targets", None) is not None:
        return
    build = client._build_targets
    memo: dict = {}
    client._workbench_targets = memo

    def build_targets(targets):
        if not isinstance(targets, list):
            return build(targets)
        key = (tuple(targets), tuple(client._ids))
        if key not in memo:
            if len(memo) > 64:
                memo.clear()
            memo[key] = build(targets)
        idents, ids = memo[key]
        return list(idents), list(ids)

    client._build_targets = build_targets


def submit(bview, fn, args, kwargs):
    """``fn`` (``rpc.handle``, or ``api.apply``'s function) on every engine of ``bview``, wrapped
    so that it never raises there."""
    return bview.apply_async(rpc.fanned, fn, *args, **kwargs)


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
        self._final: list | None = None
        # the client keeps what arrived for each id until told otherwise (its own calls: once their
        # output is in, which for a coalesced call it cannot tell): dropped with this call
        weakref.finalize(self, _forget, client.metadata, [msg_id, *self._output_ids])

    def outcomes(self) -> list[tuple]:
        """``(published, error content, value)`` per rank, in rank order, once the reply is in."""
        if self._outcomes is None:
            flat = self.ar.get()
            if flat and isinstance(flat[0], dict) and COALESCED in flat[0]:
                # merged by content in the tree (controller_process): each distinct reply once
                distinct = flat[1:]
                flat = [distinct[i] for i in flat[0]["index"]]
            order = self.ar._metadata[0]["engine_id"]  # the tree's order: by scheduler, then target
            by_engine = dict(zip(order, flat))
            self._outcomes = [by_engine[e] for e in self.engine_ids]
        return self._outcomes

    def metadata(self) -> list[dict]:
        """Each rank's output so far (stdout, stderr, outputs, execute_result, error, data)."""
        if self._final is not None:
            return self._final
        md = self.client.metadata
        return [md.get(i, NO_OUTPUT) for i in self._output_ids]

    def output_in(self, timeout: float) -> bool:
        """Wait until every rank that published something has sent its end-of-output marker."""
        waiting = [i for i, (published, _, _) in zip(self._output_ids, self.outcomes()) if published != 0]
        deadline = time.monotonic() + timeout
        md = self.client.metadata
        while waiting:
            waiting = [i for i in waiting if OUTPUT_DONE not in ((md.get(i) or {}).get("data") or {})]
            if not waiting:
                break
            if time.monotonic() >= deadline:
                return False
            time.sleep(OUTPUT_POLL_S)
        self._final = self.metadata()  # all in: nothing more will come for this call
        return True


def _forget(metadata: dict, ids: list[str]) -> None:
    for i in ids:
        metadata.pop(i, None)
