"""The notebook end of the event stream: a ZMQ PULL socket and a thread feeding a store.

The notebook binds (it is the one fixed point; ranks come and go) on a free port,
loopback-only when every rank is on this host. Each rank connects one PUSH socket, so
a rank's events arrive in the order it sent them; ZMQ over TCP delivers each message
once, and the store still drops and counts any duplicate.
"""
from __future__ import annotations

import socket
import threading

from .. import events
from .store import EventStore


class Collector:
    def __init__(self, store: EventStore | None = None, *, local_only: bool = True):
        import zmq

        self.store = store or EventStore()
        self._ctx = zmq.Context()  # private: closing it never touches the kernel's own sockets
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, 100_000)
        self._sock.setsockopt(zmq.LINGER, 0)
        bind_host = "127.0.0.1" if local_only else "0.0.0.0"
        port = self._sock.bind_to_random_port(f"tcp://{bind_host}")
        self.address = f"tcp://{'127.0.0.1' if local_only else socket.gethostname()}:{port}"
        self.errors: list[str] = []
        self.mirror = None  # a stream.mirror.Mirror once the Lab registry asks for one
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workbench-collector", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import zmq

        from ..background import lower_this_thread

        lower_this_thread()  # gives way to ranks training on the same cores
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            while True:
                try:
                    data = self._sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    batch = events.decode(data)
                    self.store.add(batch)
                    if self.mirror is not None:
                        self.mirror.offer(batch)
                except Exception as exc:  # a bad message must not kill the collector
                    self.errors.append(f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        if self.mirror is not None:
            self.mirror.close()
        self._sock.close(linger=0)
        self._ctx.term()
