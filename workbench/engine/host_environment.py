"""What Python, torch, workbench and packages this rank's host runs, as its own Python sees
them (the first distribution on its path), compared by the notebook before the bootstrap."""

from __future__ import annotations

import platform
import socket

from ..shared import package, replies


def report(packages: tuple[str, ...] = ()) -> replies.HostEnvironment:
    return replies.HostEnvironment(
        host=socket.gethostname(),
        python=platform.python_version(),
        versions=package.versions(dict.fromkeys(("torch", package.DISTRIBUTION, *packages))),
        workbench_digest=package.digest(),
    )
