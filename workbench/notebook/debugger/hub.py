"""The notebook end of the ranks' debug links: one ZMQ ROUTER per rank set.

Bound where the set's event stream is (never every interface), with the set's key: a message
without a valid MAC, from another session or replayed is dropped and counted (``rejected``).
Replies resolve their request's future; a rank's events go to the ``listener`` (the kernel's
debugger adapter); pdb sessions queue their messages per rank. A thread owns the socket and
sleeps in a poll until a rank sends or the notebook queues a message.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import os
import queue
import secrets
import socket
import threading

from ...shared import debug_wire

REQUEST_S = 10.0  # a rank that does not answer a request within this is said to be gone


class RankGone(RuntimeError):
    """A rank did not answer the debugger (it ended, or its link is down)."""


class Hub:
    def __init__(self, bind_ip: str, key: bytes):
        import zmq

        self.key = key
        self.rejected = 0
        self.listener = None  # fn(message) for a rank's events; called on the hub's thread
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a rank whose link is gone is an error, not a silent drop
        port = self._sock.bind_to_random_port(f"tcp://{bind_ip}")
        self.link = debug_wire.LinkAddress(f"tcp://{bind_ip}:{port}", key, secrets.token_hex(8))
        self._idents: dict[int, bytes] = {}
        self._replay = debug_wire.Replay()
        self._seq = itertools.count(1)
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[int, concurrent.futures.Future]] = {}
        self._out: collections.deque = collections.deque()
        self._pdb: dict[int, queue.Queue] = collections.defaultdict(queue.Queue)
        self.pdb_open: dict[int, str] = {}  # rank -> thread of a pdb session waiting for the notebook
        self._lock = threading.Lock()
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="workbench-debug-hub", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ to the ranks
    def send(self, rank: int, message: dict) -> bool:
        """Queue ``message`` for ``rank``'s link; False where that rank has no link open."""
        with self._lock:
            ident = self._idents.get(rank)
        if ident is None:
            return False
        self._out.append((rank, ident, message))
        self._wake()
        return True

    def request(self, rank: int, command: str, arguments: dict | None = None, **extra) -> concurrent.futures.Future:
        """Ask ``rank``'s debugger; the future holds the reply (``success``, ``body``, ``message``)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        rid = next(self._ids)
        with self._lock:
            self._pending[rid] = (rank, future)
        message = {"op": "request", "to": "debugger", "id": rid, "command": command, "arguments": arguments or {}}
        if not self.send(rank, {**message, **extra}):
            with self._lock:
                self._pending.pop(rid, None)
            future.set_exception(RankGone(f"rank {rank} has no debug link open (it is not in a cell being debugged)"))
        return future

    def ask(self, rank: int, command: str, arguments: dict | None = None, timeout: float = REQUEST_S, **extra) -> dict:
        """:meth:`request` and wait for the reply's body; raises naming the rank otherwise."""
        future = self.request(rank, command, arguments, **extra)
        try:
            reply = future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise RankGone(f"rank {rank} did not answer {command!r} within {timeout:g} s") from None
        if not reply.get("success"):
            raise RuntimeError(reply.get("message") or f"rank {rank} refused {command!r}")
        return reply.get("body") or {}

    def fail_pending(self, rank: int, text: str) -> None:
        """Fail the requests still waiting on ``rank`` (its cell ended: nobody will answer them)."""
        with self._lock:
            gone = [rid for rid, (r, _) in self._pending.items() if r == rank]
            futures = [self._pending.pop(rid)[1] for rid in gone]
        for future in futures:
            if not future.done():
                future.set_exception(RankGone(text))

    def linked(self) -> list[int]:
        with self._lock:
            return sorted(self._idents)

    # ------------------------------------------------------------------ pdb sessions
    def pdb_messages(self, rank: int) -> queue.Queue:
        return self._pdb[rank]

    def pdb_send(self, rank: int, message: dict) -> bool:
        return self.send(rank, {**message, "to": "pdb"})

    # ------------------------------------------------------------------ the thread
    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _run(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while not self._closed:
            ready = dict(poller.poll())
            if self._wake_r in ready:
                os.read(self._wake_r, 4096)
            while self._out:
                rank, ident, message = self._out.popleft()
                frames = debug_wire.pack(self.key, {**message, "sid": self.link.sid, "seq": next(self._seq)})
                try:
                    self._sock.send_multipart([ident, *frames])
                except zmq.ZMQError:  # that link is gone
                    self._forget(rank, ident)
            if self._sock in ready:
                while True:
                    try:
                        ident, *frames = self._sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._receive(ident, frames)

    def _receive(self, ident: bytes, frames: list[bytes]) -> None:
        message = debug_wire.unpack(self.key, frames)
        rank = message.get("rank") if message else None
        if (
            message is None
            or message.get("sid") != self.link.sid
            or not isinstance(rank, int)
            or not self._replay.fresh(str(message.get("lid")), message.get("seq"))
        ):
            self.rejected += 1
            return
        op = message.get("op")
        with self._lock:
            if op == "hello" or self._idents.get(rank) != ident:
                self._idents[rank] = ident  # the newest link of a rank is the one to answer
        if op == "reply":
            with self._lock:
                pending = self._pending.pop(message.get("id"), None)
            if pending is not None and not pending[1].done():
                pending[1].set_result(message)
        elif op == "pdb":
            if message.get("kind") == "open":
                self.pdb_open[rank] = str(message.get("thread", ""))
            elif message.get("kind") == "close":
                self.pdb_open.pop(rank, None)
            self._pdb[rank].put(message)
        elif self.listener is not None and op != "hello":
            try:
                self.listener(message)
            except Exception:  # the adapter's trouble must not end the hub
                pass

    def _forget(self, rank: int, ident: bytes) -> None:
        with self._lock:
            if self._idents.get(rank) == ident:
                del self._idents[rank]
        self.fail_pending(rank, f"rank {rank}'s debug link is gone")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake()
        self._thread.join(2.0)
        with self._lock:
            futures = [f for _, f in self._pending.values()]
            self._pending.clear()
        for future in futures:
            if not future.done():
                future.set_exception(RankGone("the rank set's debug hub is closed"))
        self._sock.close(linger=0)
        self._ctx.term()
        os.close(self._wake_r)
        os.close(self._wake_w)


_HUBS: dict[int, tuple[object, Hub]] = {}
_HUBS_LOCK = threading.Lock()


def _all_local(rankset) -> bool:
    here = socket.gethostname()
    return all(d.get("host") == here for d in (rankset.info or [])) if rankset.info else True


def of(rankset) -> Hub:
    """The hub of ``rankset``, made on first use (bound as its event stream is), closed when it stops."""
    with _HUBS_LOCK:
        held = _HUBS.get(id(rankset))
        if held is not None and held[0] is rankset:
            return held[1]
        for key, (rs, old) in list(_HUBS.items()):  # sets stopped without the API's listeners
            if getattr(rs, "stopped", False):
                del _HUBS[key]
                old.close()
        ip = "127.0.0.1" if _all_local(rankset) else getattr(rankset, "listen_ip", "127.0.0.1")
        hub = Hub(ip, getattr(rankset, "secret", None) or secrets.token_bytes(32))
        _HUBS[id(rankset)] = (rankset, hub)
        return hub


def existing(rankset) -> Hub | None:
    held = _HUBS.get(id(rankset))
    return held[1] if held is not None and held[0] is rankset else None


def close(rankset) -> None:
    with _HUBS_LOCK:
        held = _HUBS.pop(id(rankset), None)
    if held is not None:
        held[1].close()
