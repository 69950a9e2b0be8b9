"""The notebook end of the event stream: a ZMQ PULL socket and a thread feeding a store.

The notebook binds (it is the one fixed point; ranks come and go) on a free port of loopback, or
of the rank set's chosen address when ranks are remote (never every interface). Each rank
connects one PUSH socket, so its events arrive in the order it sent them; the store still drops
and counts any duplicate. Every batch carries an HMAC-SHA256 under the rank set's key (shipped
through ipyparallel's own signed channel): a batch without a valid one is dropped and counted in
``rejected``, never shown.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading

from ...shared import events
from .store import EventStore


class Collector:
    def __init__(
        self,
        store: EventStore | None = None,
        *,
        local_only: bool = True,
        bind_ip: str | None = None,
        key: bytes | None = None,
        paused: bool = False,
    ):
        """``paused``: bind now, read nothing until :meth:`begin` (a set taken over from
        another process: its batches wait in the socket until the store they belong in is here)."""
        import zmq

        self.store = store or EventStore()
        self.key = key or secrets.token_bytes(32)
        self.rejected = 0  # messages dropped for a missing or wrong HMAC
        self._ctx = zmq.Context()  # private: closing it never touches the kernel's own sockets
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, 100_000)
        self._sock.setsockopt(zmq.LINGER, 0)
        bind_host = bind_ip or "127.0.0.1"
        if not local_only and bind_ip is None:
            raise ValueError("a collector for remote ranks needs the address they reach (bind_ip)")
        port = self._sock.bind_to_random_port(f"tcp://{bind_host}")
        self.address = f"tcp://{bind_host}:{port}"
        self.errors: list[str] = []
        self.mirror = None  # a stream.mirror.Mirror once the Lab registry asks for one
        self._stop = threading.Event()
        # the thread sleeps until a batch arrives or close() writes a byte here, not on a timer:
        # a timer would wake it on the cores the ranks train on
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="workbench-collector", daemon=True)
        if not paused:
            self._thread.start()

    def begin(self, store: EventStore | None = None) -> None:
        """Start reading a paused collector, into ``store`` when given."""
        if store is not None:
            self.store = store
        self._thread.start()

    def drain(self, quiet: float = 0.3, limit: float = 10.0) -> None:
        """Return once nothing has arrived for ``quiet`` seconds (the ranks' stream went elsewhere
        and what they had sent here is in the store), or after ``limit`` seconds."""
        import time

        deadline = time.monotonic() + limit
        seen, since = self.store.received, time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.05)
            if self.store.received != seen:
                seen, since = self.store.received, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return

    def _run(self) -> None:
        import zmq

        from ..background import lower_this_thread

        lower_this_thread()  # gives way to ranks training on the same cores
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while not self._stop.is_set():
            if self._sock not in dict(poller.poll()):
                continue
            while True:
                try:
                    frames = self._sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                data = frames[-1]
                good = hmac.new(self.key, data, hashlib.sha256).digest()
                if len(frames) != 2 or not hmac.compare_digest(frames[0], good):
                    self.rejected += 1
                    continue
                try:
                    batch = events.decode(data)
                    self.store.add(batch)
                    if self.mirror is not None:
                        self.mirror.offer(batch)
                except Exception as exc:  # a bad message must not kill the collector
                    self.errors.append(f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join(2.0)
        os.close(self._wake_r)
        os.close(self._wake_w)
        if self.mirror is not None:
            self.mirror.close()
        self._sock.close(linger=0)
        self._ctx.term()
