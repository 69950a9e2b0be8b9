"""A rank's debug link to the notebook: one signed ZMQ connection, open while it is needed.

Each cell's request says where the notebook's hub is (:func:`configure`); the cell debugger,
pdb or a post-mortem opens the link, the last to close it ends it. A thread of the link owns
the socket: it sends what other threads queue (woken by a pipe, never on a timer) and hands
each message from the hub to the handler it is addressed to (``to``). Wire: ``debug_wire``.
"""

from __future__ import annotations

import collections
import os
import secrets
import threading

from ..shared import debug_wire

_LOCK = threading.Lock()
_ADDRESS: debug_wire.LinkAddress | None = None
_RANK = 0
_LINK: Link | None = None


class Link:
    """One connection to the hub; messages from the rank are ``send``; from the hub, handled."""

    def __init__(self, address: debug_wire.LinkAddress, rank: int):
        import zmq

        self.address = address
        self.rank = rank
        self.lid = f"{rank}-{secrets.token_hex(6)}"  # this connection, for the hub's replay check
        self.rejected = 0
        self.handlers: dict[str, object] = {}
        self.users = 0
        self._seq = 0
        self._replay = debug_wire.Replay()
        self._out: collections.deque = collections.deque()
        self._closed = False
        self._ctx = zmq.Context()  # private: never the kernel's or the event stream's
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 1000)
        # a hub that went away is retried with a growing interval, not ten times a second
        self._sock.setsockopt(zmq.RECONNECT_IVL_MAX, 10_000)
        self._sock.connect(address.address)
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="workbench-debug-link", daemon=True)
        self._thread.start()
        self.send({"op": "hello"})

    def send(self, message: dict) -> None:
        """Queue ``message`` for the hub (any thread); the link's thread sends it."""
        self._out.append(message)
        try:
            os.write(self._wake_w, b"x")
        except OSError:  # closed meanwhile
            pass

    def _frames(self, message: dict) -> list[bytes]:
        self._seq += 1
        message = {**message, "sid": self.address.sid, "rank": self.rank, "lid": self.lid, "seq": self._seq}
        return debug_wire.pack(self.address.key, message)

    def _run(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while True:
            ready = dict(poller.poll())
            if self._wake_r in ready:
                os.read(self._wake_r, 4096)
            while self._out:
                self._sock.send_multipart(self._frames(self._out.popleft()))
            if self._closed:
                break
            if self._sock in ready:
                while True:
                    try:
                        frames = self._sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._receive(frames)

    def _receive(self, frames: list[bytes]) -> None:
        message = debug_wire.unpack(self.address.key, frames)
        if (
            message is None
            or message.get("sid") != self.address.sid
            or not self._replay.fresh("hub", message.get("seq"))
        ):
            self.rejected += 1
            return
        handler = self.handlers.get(message.get("to"))
        if handler is None:
            if message.get("op") == "request":  # nobody here to answer: say so, never leave it waiting
                self.send(_refusal(message, f"rank {self.rank} is not stopped in the debugger"))
            return
        try:
            handler(message)
        except Exception as exc:  # a bad request must not end the link
            if message.get("op") == "request":
                self.send(_refusal(message, f"rank {self.rank}: {type(exc).__name__}: {exc}"))

    def close(self) -> None:
        """Send what is queued, then end the thread and the socket."""
        self._closed = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        self._thread.join(5)
        self._sock.close(linger=1000)
        self._ctx.term()
        os.close(self._wake_r)
        os.close(self._wake_w)


def _refusal(request: dict, text: str) -> dict:
    return {"op": "reply", "id": request.get("id"), "success": False, "message": text}


def reply(request: dict, body: dict | None = None, *, message: str | None = None) -> dict:
    """The reply to ``request``: success with ``body``, or failure saying ``message``."""
    if message is not None:
        return _refusal(request, message)
    return {"op": "reply", "id": request.get("id"), "success": True, "body": body or {}}


def configure(address: debug_wire.LinkAddress, rank: int) -> None:
    """Where the notebook's hub is (every cell's request says it); an open link to another
    hub is left to its users, the next one opens to this address."""
    global _ADDRESS, _RANK
    _ADDRESS, _RANK = address, rank


def configured() -> bool:
    return _ADDRESS is not None


def open_for(name: str, handler) -> Link | None:
    """The link, opened if need be, with ``handler(message)`` for messages to ``name``;
    None where no notebook has told this rank where its hub is."""
    global _LINK
    with _LOCK:
        if _ADDRESS is None:
            return None
        if _LINK is None or _LINK.address != _ADDRESS:
            _LINK = Link(_ADDRESS, _RANK) if _LINK is None or not _LINK.users else _LINK
        _LINK.handlers[name] = handler
        _LINK.users += 1
        return _LINK


def close_for(name: str, link: Link) -> None:
    """``name`` is done with ``link``: it closes when nobody else uses it."""
    global _LINK
    with _LOCK:
        link.handlers.pop(name, None)
        link.users -= 1
        if link.users > 0:
            return
        if _LINK is link:
            _LINK = None
    link.close()
