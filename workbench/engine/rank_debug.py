"""pdb on a rank, driven from the notebook over a loopback socket.

``breakpoint()`` on a rank (and ``%distrain debug --ranks N`` after an exception)
opens a listening socket on 127.0.0.1 only, announces its port and a one-time token
in a file of the rank set's state folder, and runs pdb on the one connection that
presents the token. The notebook side (``cluster.debugging``) relays pdb's output
to the cell and the user's commands back.
"""

from __future__ import annotations

import os
import pdb
import secrets
import socket
import sys

ACCEPT_S = 600.0  # how long a rank waits for the notebook to attach before going on
_DIR: str | None = None
_RANK = 0


def install(debug_dir: str, rank: int) -> None:
    """Make ``breakpoint()`` on this rank open a session for the notebook."""
    global _DIR, _RANK
    os.makedirs(debug_dir, exist_ok=True)
    _DIR, _RANK = debug_dir, rank
    sys.breakpointhook = _breakpoint


class _SocketPdb(pdb.Pdb):
    """pdb whose terminal is one socket; the session ends on continue or quit."""

    def __init__(self, conn: socket.socket):
        self._conn = conn
        self._file = conn.makefile("rw", buffering=1, encoding="utf-8", newline="\n")
        super().__init__(stdin=self._file, stdout=self._file, nosigint=True)
        self.use_rawinput = False
        self.prompt = f"(Pdb rank {_RANK}) "
        self._ended = False

    def set_continue(self):
        super().set_continue()
        self._ended = True

    def set_quit(self):
        super().set_quit()
        self._ended = True

    def interaction(self, frame, tb_or_exc):
        try:
            super().interaction(frame, tb_or_exc)
        finally:
            if self._ended:
                self.close()

    def close(self) -> None:
        self._ended = True
        try:
            self._file.close()
            self._conn.close()
        except OSError:
            pass


def _attach() -> _SocketPdb | None:
    """Wait for the notebook to connect; None where it did not (no notebook watching)."""
    if _DIR is None:
        return None
    token = secrets.token_hex(16)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(ACCEPT_S)
        path = os.path.join(_DIR, f"rank{_RANK}.session")
        with open(path + ".tmp", "w") as fh:
            fh.write(f"{server.getsockname()[1]} {token}\n")
        os.chmod(path + ".tmp", 0o600)
        os.replace(path + ".tmp", path)  # the notebook never reads half a file
        try:
            while True:
                conn, _ = server.accept()
                conn.settimeout(None)
                if conn.makefile("r", encoding="utf-8").readline().strip() == token:
                    return _SocketPdb(conn)
                conn.close()  # not the notebook: wait for the right one
        except OSError:  # timed out: nobody attached
            return None
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass


def _breakpoint(*args, **kwargs) -> None:
    debugger = _attach()
    if debugger is None:
        print(f"rank {_RANK}: breakpoint() skipped, no notebook attached within {ACCEPT_S:g} s", file=sys.stderr)
        return
    debugger.set_trace(sys._getframe(1))


def post_mortem() -> str:
    """Debug the last exception a cell raised on this rank (called from the notebook)."""
    tb = getattr(sys, "last_traceback", None)
    if tb is None:
        return "no exception to debug on this rank (a cell that raised leaves one)"
    debugger = _attach()
    if debugger is None:
        return "the notebook did not attach"
    value = getattr(sys, "last_value", None)
    if value is not None:
        debugger.message(f"post-mortem: {type(value).__name__}: {value}")
    debugger.reset()
    debugger.interaction(None, tb)
    debugger.close()
    return "ok"
