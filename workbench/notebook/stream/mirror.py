"""A copy of the event stream for the Jupyter server extension (the Lab's live panes).

The kernel's collector hands each decoded batch here; a thread of its own (so it keeps going
while a cell runs) keeps it (bounded) as history and sends it to every subscriber on a ZMQ
ROUTER socket bound to 127.0.0.1 with CURVE: only a reader that knows the socket's public key
(in the 0600 registry entry, :mod:`workbench.notebook.registry`) completes the handshake. A new
subscriber gets the history first, then every later batch, so a late pane shows the run so far.
"""

from __future__ import annotations

import os
import threading
from collections import deque

from ...shared import events

SUBSCRIBE = b"subscribe"
BYE = b"bye"


class Mirror:
    def __init__(self, max_events: int = 200_000):
        import zmq

        self.public_key, secret = (k.decode() for k in zmq.curve_keypair())
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.curve_server = True
        self._sock.curve_secretkey = secret.encode()
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a gone subscriber raises, and is dropped
        self._sock.setsockopt(zmq.SNDHWM, 100_000)
        self._sock.setsockopt(zmq.LINGER, 0)
        port = self._sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self.max_events = max_events
        self.history: deque = deque()  # (n events, encoded batch)
        self._n = 0
        self._pending: deque = deque()
        # the thread sleeps until a batch is offered (a byte on this pipe), not on a timer
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self.subscribers: set[bytes] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workbench-stream-mirror", daemon=True)
        self._thread.start()

    def offer(self, batch: list[dict]) -> None:
        """Called on the collector's thread: cheap, the encoding happens on the mirror's."""
        self._pending.append(batch)
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):  # already full of wake-ups: the thread is awake
            pass

    def _run(self) -> None:
        import zmq

        from ..background import lower_this_thread

        lower_this_thread()
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll())
            if self._wake_r in ready:
                os.read(self._wake_r, 4096)
            if self._sock in ready:
                self._requests(zmq)
            while self._pending:
                batch = self._pending.popleft()
                data, n = events.encode(batch), len(batch)
                self.history.append((n, data))
                self._n += n
                while self._n > self.max_events and len(self.history) > 1:
                    self._n -= self.history.popleft()[0]
                for ident in list(self.subscribers):
                    self._send(zmq, ident, data)

    def _requests(self, zmq) -> None:
        while True:
            try:
                ident, msg = self._sock.recv_multipart(zmq.NOBLOCK)[:2]
            except zmq.Again:
                return
            except ValueError:
                continue
            if msg == SUBSCRIBE:
                self.subscribers.add(ident)
                for _n, data in list(self.history):
                    if not self._send(zmq, ident, data):
                        break
                self._send(zmq, ident, b"[]")  # end of history: the reader knows it is live now
            elif msg == BYE:
                self.subscribers.discard(ident)

    def _send(self, zmq, ident: bytes, data: bytes) -> bool:
        try:
            self._sock.send_multipart([ident, data], zmq.NOBLOCK)
            return True
        except zmq.ZMQError:  # gone, or too slow to keep up: it subscribes again
            self.subscribers.discard(ident)
            return False

    def close(self) -> None:
        self._stop.set()
        self._wake()
        self._thread.join(2.0)
        self._sock.close(linger=0)
        self._ctx.term()
        os.close(self._wake_r)
        os.close(self._wake_w)
