"""The controller seen from the notebook while a start waits for its ranks: still running, or
ended, and why (its part's own line, else the last lines it printed)."""

from __future__ import annotations

import psutil

from .controller_process import PART_FAILED


class ControllerEnded(RuntimeError):
    """The controller ended before the ranks registered: waiting on would wait the full limit."""


def start_controller(cluster) -> None:
    """``cluster.start_controller_sync()``; a controller whose part failed before it wrote its
    connection files raises :class:`ControllerEnded` with that part's reason."""
    try:
        cluster.start_controller_sync()
    except RuntimeError:
        check(cluster)
        raise


def check(cluster) -> None:
    """Raise :class:`ControllerEnded` if ``cluster``'s controller has ended; else return."""
    ctl = getattr(cluster, "controller", None)
    proc = getattr(ctl, "process", None)
    if proc is None:
        return
    try:
        if proc.status() != psutil.STATUS_ZOMBIE:
            return
    except psutil.NoSuchProcess:
        pass
    said = _output(ctl)
    parts = [line[len(PART_FAILED) :].strip() for line in said if line.startswith(PART_FAILED)]
    why = f"its part {parts[0]}" if parts else "its last lines:\n" + "\n".join(said[-5:])
    raise ControllerEnded(f"the controller (pid {proc.pid}) ended before the ranks registered: {why}")


def _output(ctl) -> list[str]:
    """What the ended controller printed: ipyparallel reads its file once it ends, then removes
    it, so its own copy first."""
    try:
        return (ctl.get_output() or "").splitlines()
    except Exception:
        return []
