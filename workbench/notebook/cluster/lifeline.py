"""Notebook end of the rank guards' connections (see ``workbench.engine.guard``).

One listening socket per rank set, on the address the remote ranks reach. Each guard says
hello (host, the engine's pid), beats every ``wire.BEAT_S`` and, when its engine ends, sends the
exit status; a line whose HMAC does not match the rank set's key is dropped and counted. The
notebook never writes: when this process dies the kernel closes every connection, and the guards
end their ranks. A host whose guards all fall silent is lost (:meth:`Lifeline._check_silence`).
"""

from __future__ import annotations

import socket
import threading

from ...shared import wire

HOST_SILENCE_S = 3.0  # six missed beats: a loaded host still beats, a link down does not


class Lifeline:
    def __init__(self, ip: str, key: bytes, on_exit=None, on_lost=None):
        self.key = key
        self.on_exit = on_exit  # fn(host, pid, code) when a guarded engine ends
        self.on_lost = on_lost  # fn(host, silent_s) once, when a host's guards all fall silent
        self.lost: dict[str, float] = {}  # host -> the silence (s) after which it was named lost
        self._heard: dict[socket.socket, tuple[str | None, float]] = {}  # open conn -> (host, last line)
        self.hellos: list[dict] = []
        self.exits: dict[tuple[str, int], int] = {}
        self.rejected = 0
        self._conns: list[socket.socket] = []
        self._readers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((ip, 0))
        self._sock.listen(256)
        self.address = f"{ip}:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, name="workbench-lifeline", daemon=True).start()

    def env(self) -> dict:
        return {wire.ENV_LIFELINE: self.address, wire.ENV_LIFELINE_KEY: self.key.hex()}

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._read, args=(conn,), name="workbench-lifeline-conn", daemon=True)
            with self._lock:
                self._conns.append(conn)
                self._readers.append(t)
            t.start()

    def _read(self, conn: socket.socket) -> None:
        """Lines from one guard until it closes; between lines, watch its host's silence.

        Reads with a timeout and splits lines itself: a file object made by ``makefile``
        cannot be read again once a read timed out."""
        import time

        conn.settimeout(wire.BEAT_S)
        with self._lock:
            self._heard[conn] = (None, time.monotonic())
        buf = b""
        try:
            while True:  # until the guard closes its end (its rank is gone) or the socket is closed
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    if not self._closed:
                        self._check_silence(conn)
                    continue
                except OSError:
                    return
                if not data:
                    return
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    self._line(conn, line + b"\n")
        finally:
            with self._lock:
                self._heard.pop(conn, None)

    def _line(self, conn: socket.socket, line: bytes) -> None:
        import time

        msg = wire.verify(self.key, line)
        if msg is None:
            self.rejected += 1
            return
        with self._lock:
            host = self._heard.get(conn, (None, 0.0))[0]
            if msg.get("kind") == "hello":
                host = msg.get("host")
                self.hellos.append(msg)
            self._heard[conn] = (host, time.monotonic())
        if msg.get("kind") == "exit":
            host, pid, code = msg.get("host"), int(msg.get("pid", -1)), int(msg.get("code", 0))
            self.exits[(host, pid)] = code
            if self.on_exit is not None:
                self.on_exit(host, pid, code)

    def _check_silence(self, conn: socket.socket) -> None:
        """Name this connection's host lost once every open connection from it is silent.

        A link that goes down (or a host that loses power) shows no exit and closes nothing:
        silence is the only sign. After ``HOST_SILENCE_S`` of it from every open connection of a
        host, ``on_lost(host, silent_s)`` is called once, and its ranks are named dead with it."""
        import time

        now = time.monotonic()
        with self._lock:
            host = self._heard.get(conn, (None, now))[0]
            if host is None or host in self.lost:
                return
            last = max(t for h, t in self._heard.values() if h == host)
            silent = now - last
            if silent < HOST_SILENCE_S:
                return
            self.lost[host] = silent
        if self.on_lost is not None:
            self.on_lost(host, silent)

    def hosts_said_hello(self) -> set[str]:
        with self._lock:
            return {h.get("host") for h in self.hellos}

    def close(self, wait: float = 5.0) -> list[str]:
        """End every guard's connection: each guard then ends its rank and exits.

        Waits up to ``wait`` seconds for the guards to close their ends (their ranks are
        gone then); returns the hosts of guards that had not.
        """
        import time

        self._closed = True
        self.on_exit = None
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            conns, self._conns = self._conns, []
            # a lost host's guards cannot hear the close: no wait for them
            gone = {c for c, (h, _) in self._heard.items() if h in self.lost}
            readers = [t for c, t in zip(conns, self._readers) if c not in gone]
        for c in conns:
            try:
                c.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        for t in readers:
            t.join(max(0.0, deadline - time.monotonic()))
        late = [str(i) for i, t in enumerate(readers) if t.is_alive()]
        for c in conns:
            try:
                c.close()
            except OSError:
                pass
        return late
