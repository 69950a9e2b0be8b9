"""pdb on a rank, its terminal the notebook's input box, over the rank's debug link.

``breakpoint()`` on a rank (and ``%distrain debug --ranks N`` after an exception) opens the
rank's debug link to the notebook (``debug_link``: the signed connection every rank, on this
host or another, makes to its notebook) and asks for a pdb session; the cell running in the
notebook (``cluster.debugging``) attaches, shows pdb's output tagged with the rank and asks for
each command with ``input()``. Where JupyterLab's debugger runs the cell (``cell_debugger``),
``breakpoint()`` in the cell's thread stops there instead, as it does in the kernel itself.
"""

from __future__ import annotations

import pdb
import queue
import sys
import threading

from ..shared import debug_wire
from . import cell_debugger, debug_link

ACCEPT_S = 600.0  # how long a rank waits for the notebook to attach before going on
_RANK = 0


def install(rank: int) -> None:
    """Make ``breakpoint()`` on this rank open a session for the notebook."""
    global _RANK
    _RANK = rank
    sys.breakpointhook = _breakpoint


class _Terminal:
    """pdb's stdin and stdout: output gathers until pdb reads a command, then goes with the prompt."""

    def __init__(self, link: debug_link.Link, inbox: queue.Queue, prompt: str):
        self._link, self._inbox, self._prompt = link, inbox, prompt
        self._text: list[str] = []
        self.closed = False

    def write(self, text: str) -> int:
        self._text.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def taken(self) -> str:
        text, self._text = "".join(self._text), []
        return text

    def readline(self) -> str:
        text = self.taken()
        if text.endswith(self._prompt):
            text = text[: -len(self._prompt)]
        self._link.send({"op": "pdb", "kind": "prompt", "text": text, "prompt": self._prompt})
        while True:
            try:
                message = self._inbox.get(timeout=ACCEPT_S)
            except queue.Empty:
                return "c\n"  # nobody answers any more: go on rather than hold the rank
            if message.get("op") == "line":
                return str(message.get("line", "")) + "\n"


class _LinkPdb(pdb.Pdb):
    """pdb whose terminal is the link; the session ends on continue or quit."""

    def __init__(self, terminal: _Terminal, session: _Session):
        super().__init__(stdin=terminal, stdout=terminal, nosigint=True)
        self.use_rawinput = False
        self.prompt = f"(Pdb rank {_RANK}) "
        self._terminal = terminal
        self._session = session
        self.ended = False

    def interaction(self, frame, tb_or_exc):
        try:
            super().interaction(frame, tb_or_exc)
        finally:
            if self.ended:
                self._session.close(self._terminal.taken())

    def set_continue(self):
        super().set_continue()
        self.ended = True

    def set_quit(self):
        super().set_quit()
        self.ended = True


class _Session:
    """One pdb session on the link: opened, attached by the notebook, then closed."""

    def __init__(self):
        self.inbox: queue.Queue = queue.Queue()
        self.link = debug_link.open_for("pdb", self.inbox.put)

    def attach(self) -> _LinkPdb | None:
        """Announce the session and wait for the notebook; None where no notebook attached."""
        if self.link is None:
            return None
        self.link.send({"op": "pdb", "kind": "open", "thread": threading.current_thread().name})
        try:
            while self.inbox.get(timeout=ACCEPT_S).get("op") != "attach":
                pass
        except queue.Empty:
            self.close()
            return None
        return _LinkPdb(_Terminal(self.link, self.inbox, f"(Pdb rank {_RANK}) "), self)

    def close(self, text: str = "") -> None:
        if self.link is None:
            return
        self.link.send({"op": "pdb", "kind": "close", "text": text})
        debug_link.close_for("pdb", self.link)
        self.link = None


def _breakpoint(*args, **kwargs) -> None:
    frame = sys._getframe(1)
    visual = cell_debugger.active_here()
    if visual is not None:  # JupyterLab's debugger runs this cell: stop there
        visual.set_trace_here(frame)
        return
    session = _Session()
    debugger = session.attach()
    if debugger is None:
        print(f"rank {_RANK}: breakpoint() skipped, no notebook attached within {ACCEPT_S:g} s", file=sys.stderr)
        return
    debugger.set_trace(frame)


def post_mortem(link: debug_wire.LinkAddress | None = None) -> str:
    """Debug the last exception a cell raised on this rank (called from the notebook, which
    says where its hub is: the cell that raised may have told another)."""
    tb = getattr(sys, "last_traceback", None)
    if tb is None:
        return "no exception to debug on this rank (a cell that raised leaves one)"
    if link is not None:
        debug_link.configure(link, _RANK)
    session = _Session()
    debugger = session.attach()
    if debugger is None:
        return "the notebook did not attach"
    value = getattr(sys, "last_value", None)
    if value is not None:
        debugger.message(f"post-mortem: {type(value).__name__}: {value}")
    debugger.ended = True  # the session ends with this interaction, whatever command ends it
    try:
        debugger.reset()
        debugger.interaction(None, tb)
    finally:
        session.close(debugger._terminal.taken())
    return "ok"
