"""What Python, torch, workbench and packages this rank's host runs, as its own Python sees
them (the first distribution on its path), compared by the notebook before the bootstrap."""

from __future__ import annotations

import functools
import os
import platform
import socket

from ..shared import replies
from ..shared.code_tree import source_digest

WORKBENCH = "distrain-workbench"


@functools.cache
def workbench_digest() -> str:
    import workbench

    return source_digest(os.path.dirname(os.path.abspath(workbench.__file__)))


def versions(names) -> dict[str, str | None]:
    """distribution name -> the version this Python imports (None: not installed)."""
    from importlib import metadata

    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def report(packages: tuple[str, ...] = ()) -> replies.HostEnvironment:
    import workbench

    names = dict.fromkeys(("torch", WORKBENCH, *packages))
    found = versions(names)
    if found.get(WORKBENCH) is None:  # a copy without its metadata: the package says its version
        found[WORKBENCH] = getattr(workbench, "__version__", None)
    return replies.HostEnvironment(
        host=socket.gethostname(),
        python=platform.python_version(),
        versions=found,
        workbench_digest=workbench_digest(),
    )
