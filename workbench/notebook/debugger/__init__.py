"""Debugging cells on the ranks: JupyterLab's debugger (``adapter``) and ``breakpoint()``'s pdb.

Every cell on the ranks carries where the rank set's debug hub is (``hub``: the notebook end
of each rank's signed debug link) and which notebook cell it is; with JupyterLab's debugger
on, it also carries the breakpoints and runs under the rank's debugger
(``workbench.engine.cell_debugger``). :func:`install` puts the adapter in front of the
kernel's own debugger (``%load_ext workbench`` does, in a Jupyter kernel).
"""

from __future__ import annotations

from ...shared import debug_wire
from ..session import KERNEL
from . import cells, hub

_ADAPTER = None  # the kernel's RankDebugger, once installed


def install(shell) -> bool:
    """Answer JupyterLab's debug requests about the ranks in this kernel; False where the
    kernel has no debugger (not ipykernel, or no debugpy)."""
    global _ADAPTER
    from ..auto_cells import is_on
    from .adapter import RankDebugger

    kernel = getattr(shell, "kernel", None)
    inner = getattr(kernel, "debugger", None)
    if inner is None or not hasattr(kernel, "_topic") or not hasattr(kernel, "get_parent"):
        return False
    if isinstance(inner, RankDebugger):
        _ADAPTER = inner
        return True
    _ADAPTER = RankDebugger(inner, lambda event: _publish(kernel, event), auto=lambda: is_on(shell))
    kernel.debugger = _ADAPTER
    return True


def _publish(kernel, event: dict) -> None:
    """A debug event on IOPub, its parent the latest debug request: JupyterLab takes IOPub
    messages whose parent is the running cell's request as a sign that nothing is stopped,
    and would replace the stopped rank's variables with the kernel's own."""
    kernel.session.send(
        kernel.iopub_socket,
        "debug_event",
        event,
        parent=kernel.get_parent("control"),
        ident=kernel._topic("debug_event"),
    )


def uninstall(shell) -> None:
    global _ADAPTER
    kernel = getattr(shell, "kernel", None)
    if _ADAPTER is not None and kernel is not None and getattr(kernel, "debugger", None) is _ADAPTER:
        kernel.debugger = _ADAPTER._inner
    _ADAPTER = None


def _origin(code: str) -> debug_wire.CellOrigin | None:
    """The notebook cell being run, as JupyterLab's debugger names it (a Jupyter kernel only)."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return None
    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if kernel is None or not hasattr(kernel, "get_parent"):
        return None
    from ..auto_cells import is_on

    raw = ((kernel.get_parent("shell") or {}).get("content") or {}).get("code")
    if not isinstance(raw, str) or not cells.runs_on_ranks(raw, is_on(shell)) or code.strip() not in raw:
        return None  # the code is not the cell being run (workbench.run(...) in a plain cell)
    return cells.origin(shell.compile.get_code_name(raw, raw, 0), raw)


def for_cell(rankset, ranks: list[int], code: str) -> debug_wire.CellDebug:
    """What the request of a cell about to run on ``ranks`` carries about debugging."""
    h = hub.of(rankset)
    origin = _origin(code)
    if _ADAPTER is None:
        return debug_wire.CellDebug(link=h.link, origin=origin)
    return _ADAPTER.begin(h, ranks, origin)


def cell_ended() -> None:
    if _ADAPTER is not None:
        _ADAPTER.end()


def held() -> bool:
    """Whether a rank of the running cell is stopped in JupyterLab's debugger."""
    return _ADAPTER is not None and _ADAPTER.held()


KERNEL.listeners["stopping"].append(hub.close)  # as api.on("stopping", ...), which imports the cell runner
