"""distrain workbench: persistent PyTorch ranks in a notebook.

``%load_ext workbench``, then ``%distrain start -n 4`` and ``%%distrain`` cells; from Python
``workbench.start(4)``, ``workbench.run(code)``, ``workbench.stop()``; on a rank,
``from workbench import engine``. The public names below are imported on first use, so
``import workbench`` on a rank loads no notebook module (the kernel side lives in
:mod:`workbench.notebook`, the rank side in :mod:`workbench.engine`, both use
:mod:`workbench.shared`)."""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> (module, attribute or None for the module itself)
_PUBLIC = {
    "apply": ("workbench.notebook.api", "apply"),
    "current": ("workbench.notebook.api", "current"),
    "is_running": ("workbench.notebook.api", "is_running"),
    "pull": ("workbench.notebook.api", "pull"),
    "push": ("workbench.notebook.api", "push"),
    "restart": ("workbench.notebook.restart", "restart"),  # with load=: the way back from a checkpoint
    "run": ("workbench.notebook.api", "run"),
    "start": ("workbench.notebook.api", "start"),
    "status": ("workbench.notebook.api", "status"),
    "stop": ("workbench.notebook.api", "stop"),
    "sync": ("workbench.notebook.api", "sync"),  # the synced folders' edits to the other hosts now
    "train": ("workbench.notebook.training", None),
    "metrics": ("workbench.notebook.metrics", "metrics"),
    "compare": ("workbench.notebook.metrics", "compare"),
    "session": ("workbench.notebook.api", "session"),
    "sessions": ("workbench.notebook.api", "sessions"),
    "use": ("workbench.notebook.api", "use"),
    "detach": ("workbench.notebook.handoff", "detach"),  # the set outlives this process (a keeper holds it)
    "attach": ("workbench.notebook.handoff", "attach"),
    "detached": ("workbench.notebook.handoff", "detached_sets"),
    "export_metrics": ("workbench.notebook.metrics", "export_metrics"),
    "dashboard": ("workbench.notebook.dashboard", None),  # callable: workbench.dashboard()
    "ckpt": ("workbench.notebook.checkpoints", None),  # workbench.ckpt.save() / .load("latest") / .list()
    "timelines": ("workbench.notebook.dashboard.timelines", None),
    "profiles": ("workbench.notebook.profiles", None),
    "track": ("workbench.notebook.trackers", "track"),  # workbench.track("mlflow", dir="runs")
    "untrack": ("workbench.notebook.trackers", "untrack"),
    "tracking": ("workbench.notebook.trackers", "tracking"),
    "dry_run": ("workbench.notebook.dry_run", "dry_run"),  # a layout at full scale on this CPU, beside the planner
}

# Imported with the API: they attach the event stream and the Lab registry entry to rank sets.
_NOTEBOOK_PARTS = ("workbench.notebook.stream", "workbench.notebook.registry")


def _notebook_side() -> None:
    for name in _NOTEBOOK_PARTS:
        importlib.import_module(name)


def __getattr__(name: str):
    if name in _PUBLIC:
        module, attr = _PUBLIC[name]
        _notebook_side()
        value = importlib.import_module(module)
        if attr is not None:
            value = getattr(value, attr)
        globals()[name] = value
        return value
    if name in ("engine", "notebook", "shared", "planner", "strategies", "models", "labserver", "labs"):
        return importlib.import_module(f"workbench.{name}")
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the built Lab extension lies (for `jupyter labextension develop`)."""
    return [{"src": "labextension", "dest": "distrain-workbench-lab"}]


def load_ipython_extension(ipython) -> None:
    """Register the ``%distrain`` magics (called by ``%load_ext workbench``)."""
    _notebook_side()
    from .notebook import debugger
    from .notebook.cluster import standby
    from .notebook.magics import DistrainMagics
    from .notebook.shell_compat import mark_kernelless

    if standby.wanted(ipython):  # a kernel: ranks are about to start; import their torch now
        standby.begin()
    mark_kernelless(ipython)
    ipython.register_magics(DistrainMagics)
    debugger.install(ipython)  # JupyterLab's debugger on the ranks' cells (a Jupyter kernel only)


def unload_ipython_extension(ipython) -> None:
    from .notebook import debugger
    from .notebook.api import stop
    from .notebook.cluster import standby

    stop()
    standby.close()
    debugger.uninstall(ipython)


__all__ = sorted(_PUBLIC) + ["load_ipython_extension"]
