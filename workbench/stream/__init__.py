"""Notebook side of the rank -> notebook event stream: one collector and store per rank set.

A collector is attached when ranks start (``api.on("started")``) or, for rank sets
started some other way, the first time anything asks for it; it is closed when the
ranks stop. Never imports torch.
"""
from __future__ import annotations

import socket

from .. import api
from .collector import Collector
from .store import EventStore, Thinned

__all__ = ["Collector", "EventStore", "Thinned", "attach", "detach", "stream_of"]

_STREAMS: dict[int, tuple[object, Collector]] = {}
_LAST: list = [None]  # the store of the latest rank set, still readable after it stopped


def _all_local(rankset) -> bool:
    here = socket.gethostname()
    return all(d.get("host") == here for d in (rankset.info or [])) if rankset.info else True


def attach(rankset) -> Collector:
    """The collector of ``rankset``, made and announced to its ranks on first use."""
    entry = _STREAMS.get(id(rankset))
    if entry is not None and entry[0] is rankset:
        _LAST[0] = entry[1].store
        return entry[1]
    from ..engine import publisher

    local = _all_local(rankset)
    ip = getattr(rankset, "listen_ip", "127.0.0.1")
    collector = Collector(local_only=local, bind_ip=None if local else ip,
                          key=getattr(rankset, "secret", None))
    try:
        rankset.apply(publisher.connect, collector.address, key=collector.key, timeout=60)
    except BaseException:
        collector.close()
        raise
    _STREAMS[id(rankset)] = (rankset, collector)
    _LAST[0] = collector.store
    return collector


def stream_of(rankset) -> Collector | None:
    entry = _STREAMS.get(id(rankset))
    return entry[1] if entry is not None and entry[0] is rankset else None


def last_store() -> EventStore | None:
    """The store of the current rank set, or of the last one if none is running."""
    if api.is_running():
        return attach(api.current()).store
    return _LAST[0]


def detach(rankset) -> None:
    entry = _STREAMS.pop(id(rankset), None)
    if entry is not None:
        entry[1].close()


def _on_started(rankset) -> None:
    try:
        attach(rankset)
    except Exception:  # the stream is attached again on first use; never fail a start
        pass


api.on("started", _on_started)
api.on("stopping", detach)
