"""Notebook side of the rank -> notebook event stream: one collector and store per rank set.

A collector is attached when ranks start (``api.on("started")``) or, for rank sets
started some other way, the first time anything asks for it; it is closed when the
ranks stop. Owns the session's ``stream`` part. Never imports torch.
"""

from __future__ import annotations

import socket

from ...engine import rpc
from .. import api, session
from .collector import Collector
from .store import EventStore, Thinned

__all__ = ["Collector", "EventStore", "Thinned", "attach", "detach", "last_store"]


def _all_local(rankset) -> bool:
    here = socket.gethostname()
    return all(d.get("host") == here for d in (rankset.info or [])) if rankset.info else True


def attach(rankset) -> Collector:
    """The collector of ``rankset``, made and announced to its ranks on first use; kept in
    the rank set's session."""
    sess = session.of(rankset)
    if sess.stream.collector is not None and sess.stream.listening_to is rankset:
        return sess.stream.collector
    local = _all_local(rankset)
    ip = getattr(rankset, "listen_ip", "127.0.0.1")
    # a recovery's new ranks report into the store of the run they continue
    carried = sess.store if sess.runs.recovering else new_store(sess)
    collector = Collector(
        carried, local_only=local, bind_ip=None if local else ip, key=getattr(rankset, "secret", None)
    )
    try:
        rankset.apply(rpc.handle, rpc.ConnectStream(address=collector.address, key=collector.key), timeout=60)
    except BaseException:
        collector.close()
        raise
    _listen(sess, collector, rankset)
    return collector


def _listen(sess, collector: Collector, rankset) -> None:
    sess.stream.collector, sess.stream.listening_to, sess.stream.store = collector, rankset, collector.store


def take(sess, collector: Collector, rankset, store: EventStore) -> None:
    """``sess``'s set, handed over from another process, reports to ``collector`` (still paused:
    ``collector.begin(store)`` once the store's readers are back) into ``store``, which came with it."""
    sess.stream.collector, sess.stream.listening_to, sess.stream.store = collector, rankset, store


WINDOW_ROWS = 50_000  # step rows a store keeps in memory; older ones are read back from its history
HISTORY_PART_ROWS = 10_000  # tidy rows (a metric of a step of a rank) per Parquet part of the history


def new_store(sess) -> EventStore:
    """A store for ``sess``'s new rank set: a window of rows in memory, the rest spilled to a
    Parquet history beside the session's checkpoints (written only once the window is full).
    Without pyarrow (the ``parquet`` extra) the store keeps its newest million rows instead."""
    import importlib.util
    import os
    import time

    if importlib.util.find_spec("pyarrow") is None:
        return EventStore()

    from .history import History

    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{int(time.time() * 1000) % 1000:03d}"
    return EventStore(
        WINDOW_ROWS,
        history=History(
            lambda: os.path.join(sess.checkpoint_dir, "metrics", f"{sess.name}-{stamp}"), flush_every=HISTORY_PART_ROWS
        ),
    )


def last_store(name: str | None = None) -> EventStore | None:
    """The store of the current session (or of ``name``), still readable after its ranks stopped."""
    sess = session.current() if name is None else session.KERNEL.get(name)
    if sess is None:
        return None
    if sess.running:
        return attach(sess.rankset).store
    return sess.store


def detach(rankset) -> None:
    sess = session.of(rankset)
    if sess.stream.collector is not None and sess.stream.listening_to is rankset:
        sess.stream.collector.close()
        sess.stream.collector = sess.stream.listening_to = None


def drain(sess) -> None:
    """Read what the ranks' stream still had on its way into the store (before a hand-over)."""
    if sess.stream.collector is not None and sess.stream.listening_to is sess.rankset:
        sess.stream.collector.drain()


def _on_started(rankset) -> None:
    try:
        attach(rankset)
    except Exception:  # the stream is attached again on first use; never fail a start
        pass


api.on("started", _on_started)
api.on("stopping", detach)
