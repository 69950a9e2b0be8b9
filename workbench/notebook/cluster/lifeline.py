"""Notebook end of the rank guards' connections (see ``workbench.engine.guard``).

One listening socket per rank set, on the address the remote ranks reach. Each guard
says hello (host, the engine's pid) and, when its engine ends, the exit status; a line
whose HMAC does not match the rank set's key is dropped and counted. The notebook never
writes: when this process dies the kernel closes every connection, and the guards end
their ranks.
"""

from __future__ import annotations

import socket
import threading

from ...engine import guard


class Lifeline:
    def __init__(self, ip: str, key: bytes, on_exit=None):
        self.key = key
        self.on_exit = on_exit  # fn(host, pid, code) when a guarded engine ends
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
        return {guard.ENV_ADDRESS: self.address, guard.ENV_KEY: self.key.hex()}

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
        with conn.makefile("rb") as lines:
            for line in lines:
                msg = guard.verify(self.key, line)
                if msg is None:
                    self.rejected += 1
                    continue
                if msg.get("kind") == "hello":
                    with self._lock:
                        self.hellos.append(msg)
                elif msg.get("kind") == "exit":
                    host, pid, code = msg.get("host"), int(msg.get("pid", -1)), int(msg.get("code", 0))
                    self.exits[(host, pid)] = code
                    if self.on_exit is not None:
                        self.on_exit(host, pid, code)

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
            readers = list(self._readers)
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
