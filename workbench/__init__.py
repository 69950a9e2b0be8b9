"""distrain workbench: persistent PyTorch ranks in a notebook.

``%load_ext workbench``, then ``%distrain start -n 4`` and ``%%distrain`` cells.
The same steps from Python: ``workbench.start(4)``, ``workbench.run(code)``,
``workbench.stop()``. On a rank, ``from workbench import engine``.
"""
from __future__ import annotations

from .api import apply, current, is_running, pull, push, restart, run, start, status, stop
from . import stream as _stream  # noqa: F401  (attaches the event stream when ranks start)
from . import registry as _registry  # noqa: F401  (announces rank sets to the JupyterLab extension)
from . import training as train
from .metrics import export_metrics, metrics
from . import labs  # workbench.labs.check(...) in the labs' check cells
from . import dashboard  # a callable module: workbench.dashboard() shows the live dashboard
from .checkpoint import api as ckpt  # workbench.ckpt.save() / .load("latest") / .list() / .resume(setup)

__version__ = "0.1.0"


def load_ipython_extension(ipython) -> None:
    """Register the ``%distrain`` magics (called by ``%load_ext workbench``)."""
    from .magics import DistrainMagics

    ipython.register_magics(DistrainMagics)


def unload_ipython_extension(ipython) -> None:
    stop()


__all__ = [
    "apply",
    "ckpt",
    "current",
    "dashboard",
    "export_metrics",
    "metrics",
    "train",
    "is_running",
    "load_ipython_extension",
    "pull",
    "push",
    "restart",
    "run",
    "start",
    "status",
    "stop",
]
