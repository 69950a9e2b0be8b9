"""Rank side of the event stream: a bounded queue and a sender thread PUSHing to the notebook.

ipyparallel's ``publish_data`` keeps only each engine's latest message, so steps would be
lost: each rank PUSHes signed batches to the notebook's PULL socket instead. The training
thread only appends to the queue, so a slow notebook never slows a step; a full queue counts
what it drops rather than growing without limit."""

from __future__ import annotations

import atexit
import collections
import hashlib
import hmac
import threading
import time

from ..shared import events

MAX_QUEUED = 200_000
BATCH = 1000
BATCH_WINDOW_S = 0.1  # a woken sender gathers this long before it sends (flush cuts it short)

_PUBLISHER: Publisher | None = None


class Publisher:
    """One per rank process; connected to the notebook's collector address."""

    def __init__(self, address: str, rank: int, key: bytes = b""):
        import zmq

        self.address = address
        self.rank = rank
        self._key = key
        # a private context: pyzmq terms Context.instance() at exit, which would wait
        # forever for this socket and keep a stopped rank alive until it is SIGKILLed
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUSH)
        self._sock.setsockopt(zmq.LINGER, 2000)
        self._sock.setsockopt(zmq.SNDHWM, 10_000)  # messages (batches), not events
        self._sock.connect(address)
        self._queue: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._sent = 0
        self._queued = 0
        self.dropped = 0
        self._closed = False
        self._wake = threading.Event()
        self._hurry = threading.Event()  # flush/close: send what is queued without gathering
        self._thread = threading.Thread(target=self._run, name="workbench-publisher", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)

    def _at_exit(self) -> None:
        """Process exit: give queued events a moment, then drop the socket without lingering."""
        self.flush(1.0)
        self._closed = True
        self._hurry.set()
        self._wake.set()
        self._thread.join(0.5)
        try:
            self._sock.close(linger=0)
            self._ctx.term()
        except Exception:
            pass

    def emit(self, event: dict) -> None:
        """Queue an event; never blocks (drops, and counts, when the queue is full)."""
        if self._closed:
            return
        if len(self._queue) >= MAX_QUEUED:
            self.dropped += 1
            return
        self._queue.append(event)  # deque.append is atomic: no lock on the hot path
        self._queued += 1
        if not self._wake.is_set():
            self._wake.set()

    def _run(self) -> None:
        """The sender: asleep until an ``emit`` (on 2 cores every helper's wake-up is taken from
        a step), then it gathers ``BATCH_WINDOW_S`` before each send: one message a window, not one
        a step. It keeps the rank's CPU priority: it shares the GIL with
        the training thread, and a lowered thread preempted holding the GIL stalls the step."""
        import zmq

        gathered = False  # a window has passed since the last send: what is queued goes now
        while True:
            self._wake.clear()  # before looking at the queue: an emit after this wakes us again
            if not self._queue:
                if self._closed:
                    break
                self._hurry.clear()  # everything queued before a flush has been sent
                self._wake.wait()  # emit and close wake it
                gathered = False
                continue
            if not gathered and len(self._queue) < BATCH:  # the first event after a pause: gather
                self._hurry.wait(BATCH_WINDOW_S)
            batch = []
            while self._queue and len(batch) < BATCH:
                batch.append(self._queue.popleft())
            data = events.encode(batch)
            mac = hmac.new(self._key, data, hashlib.sha256).digest()
            while True:
                try:
                    self._sock.send_multipart((mac, data), flags=zmq.NOBLOCK)
                    break
                except zmq.Again:  # the notebook is behind: wait here, not in the training thread
                    if self._closed and self._sock.closed:
                        return
                    time.sleep(0.01)
            with self._cv:
                self._sent += len(batch)
                self._cv.notify_all()
            # while a run streams, the next window gathers right away: one wake-up a window,
            # not one for its first emit and another for its end
            if len(self._queue) < BATCH:
                self._hurry.wait(BATCH_WINDOW_S)
            gathered = True

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every event queued so far has been handed to ZMQ; True when done."""
        target = self._queued
        deadline = time.monotonic() + timeout
        if self._sent < target:
            self._hurry.set()
        with self._cv:
            while self._sent < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.05))
        return True

    def close(self, timeout: float = 5.0) -> None:
        self.flush(timeout)
        self._closed = True
        self._hurry.set()
        self._wake.set()
        self._thread.join(timeout)
        self._sock.close(linger=0)
        self._ctx.term()
        atexit.unregister(self._at_exit)


def connect(address: str, rank: int | None = None, key: bytes = b"") -> dict:
    """Point this rank's stream at the notebook (called by the notebook on every rank,
    through ipyparallel's signed channel, which is how ``key`` arrives)."""
    global _PUBLISHER
    from . import runtime

    if rank is None:
        rank = runtime.context().rank
    if _PUBLISHER is not None and _PUBLISHER.address == address and _PUBLISHER._key == key:
        return {"rank": rank, "address": address, "reused": True}
    # the new one first: an event emitted meanwhile goes to one or the other, never nowhere
    # (the old one sends all it queued before its thread ends: a detached set's keeper and
    # the kernel that attaches take the stream over from each other mid-run)
    old, _PUBLISHER = _PUBLISHER, Publisher(address, rank, key)
    if old is not None:
        old.close(timeout=5.0)
    return {"rank": rank, "address": address, "reused": False}


def get() -> Publisher | None:
    return _PUBLISHER


def emit(event: dict) -> None:
    """Queue an event for the notebook; a no-op where no notebook is listening."""
    if _PUBLISHER is not None:
        _PUBLISHER.emit(event)


def flush(timeout: float = 10.0) -> bool:
    return True if _PUBLISHER is None else _PUBLISHER.flush(timeout)
