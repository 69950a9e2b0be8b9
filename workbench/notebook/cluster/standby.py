"""A warm forking parent: the ranks' torch import done before ``%distrain start`` asks for it.

Local ranks are forked by one process that imports torch first (``launchers.ForkedRanks``);
that import is the longest step of a start. A kernel that loads the extension is about to start
ranks, so :func:`begin` starts that process then, and the kernel's first local torch start takes
it (:func:`take`): its ranks are a fork away. One per kernel, ending with it. What it costs while
it waits, and when it is not used or not started: docs/getting-started.md ("Start-up").
"""

from __future__ import annotations

import atexit
import os
import threading

from .launchers import ForkedRanks

ENV = "WORKBENCH_PRELOAD"
_OFF = ("0", "off", "false", "no")
_ON = ("1", "on", "true", "yes")

_lock = threading.Lock()
_standby: ForkedRanks | None = None


def wanted(shell) -> bool:
    """A standby for this shell: a notebook kernel's (not a script's or a terminal IPython's),
    unless ``WORKBENCH_PRELOAD`` says otherwise (0: never, 1: in any IPython shell)."""
    setting = os.environ.get(ENV, "").strip().lower()
    if setting in _OFF:
        return False
    if setting in _ON:
        return True
    if setting:
        import warnings

        warnings.warn(
            f"{ENV}={os.environ[ENV]!r} is not understood, so no torch is preloaded: "
            "set it to 0 (never preload) or 1 (in any IPython shell), or leave it unset (in kernels)",
            stacklevel=2,
        )
        return False
    return getattr(shell, "kernel", None) is not None


def begin(framework: str = "torch") -> ForkedRanks | None:
    """Start the standby (once; a second call keeps the one there). Only from the main thread:
    the process's watch of the notebook follows the thread that started it. It ends with the
    kernel: the kernel's end closes its stdin, and until it is handed a start it is killed at
    once should the kernel die (``preload.end_with_parent``)."""
    global _standby
    if threading.current_thread() is not threading.main_thread():
        return None
    with _lock:
        if _standby is not None and _standby.ended() is None:
            return _standby
        _standby = ForkedRanks(framework, standby_of=os.getpid())
    # the start imports ipyparallel before it can launch the controller: done now, aside
    threading.Thread(target=_import_ipyparallel, name="workbench-preload", daemon=True).start()
    return _standby


def _import_ipyparallel() -> None:
    import ipyparallel  # noqa: F401


def current() -> ForkedRanks | None:
    """The standby waiting for a start, if any."""
    return _standby


def take(framework: str) -> ForkedRanks | None:
    """The standby for a local start of ``framework`` ranks (any world size), now no longer a
    standby; None when there is none, or it could not serve this start (then it is ended)."""
    global _standby
    with _lock:
        fr = _standby
        if fr is None or fr.framework != framework:
            return None
        _standby = None
    # the ranks inherit its environment and working directory: a kernel that changed either
    # since (a variable the ranks' libraries read, a %cd) gets a fresh process
    if fr.ended() is None and fr.environ == dict(os.environ) and fr.cwd == os.getcwd():
        return fr
    _end(fr)
    return None


def close() -> None:
    """End the standby (the extension unloaded, the kernel exiting)."""
    global _standby
    with _lock:
        fr, _standby = _standby, None
    if fr is not None:
        _end(fr)


def _end(fr: ForkedRanks) -> None:
    """It has forked nothing: ended at once, not left to finish its import first."""
    try:
        fr.proc.kill()
        fr.proc.wait(5)
    except Exception:  # gone already
        pass
    fr.close()


atexit.register(close)
