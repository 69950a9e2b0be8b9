"""The other hosts' Python, torch, workbench and packages against the notebook's, before the
ranks become ranks: a different torch or workbench (or Python minor version, which cannot
load the notebook's pickled functions) is refused, naming the host; any other package the
notebook imported that a host has in another version is a warning."""

from __future__ import annotations

import functools
import platform
import sys

from ...shared import package
from ...shared.errors import WorkbenchError

WORKBENCH = package.DISTRIBUTION
REFUSED = ("torch", WORKBENCH)


class EnvironmentMismatch(WorkbenchError):
    """A host's Python, torch or workbench is not the notebook's; nothing was started."""


@functools.cache
def _top_level_distributions() -> dict[str, list[str]]:
    from importlib import metadata

    return metadata.packages_distributions()


def imported_distributions() -> tuple[str, ...]:
    """The distributions of the top-level packages this notebook imported (not the standard library's)."""
    dists = _top_level_distributions()
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    out: dict[str, None] = {}
    for name in list(sys.modules):
        if "." in name or name.startswith("_") or name in stdlib:
            continue
        for dist in dists.get(name, ()):
            out[dist] = None
    return tuple(d for d in out if d not in REFUSED)


def notebook_environment(packages: tuple[str, ...]) -> dict:
    """The notebook's side of the comparison: python, versions, workbench digest."""
    return {
        "python": platform.python_version(),
        "versions": package.versions((*REFUSED, *packages)),
        "workbench_digest": package.digest(),
    }


def _public(version: str | None) -> str | None:
    """A version without its local label (``2.13.0+cpu`` -> ``2.13.0``): a CUDA build on the hosts
    and a CPU build in the notebook are the same torch."""
    return None if version is None else version.split("+", 1)[0]


def _label(name: str) -> str:
    return "workbench" if name == WORKBENCH else name


def compare(host: str, theirs, mine: dict) -> tuple[list[str], list[str]]:
    """(refusals, warnings) for one host's :class:`~workbench.shared.replies.HostEnvironment`."""
    refused, warned = [], []
    py, my_py = theirs.python, mine["python"]
    if py.split(".")[:2] != my_py.split(".")[:2]:
        refused.append(f"host {host}: Python {py}, the notebook {my_py}")
    elif py != my_py:
        warned.append(f"host {host}: Python {py}, the notebook {my_py}")
    for name, version in mine["versions"].items():
        other = theirs.versions.get(name)
        if name in REFUSED:
            if _public(other) != _public(version):
                refused.append(f"host {host}: {_label(name)} {other or 'not installed'}, the notebook {version}")
            elif name == WORKBENCH and theirs.workbench_digest != mine["workbench_digest"]:
                refused.append(
                    f"host {host}: workbench {other} from other sources than the notebook's {version} "
                    "(install the same build on every host)"
                )
        elif other is not None and version is not None and _public(other) != _public(version):
            warned.append(f"host {host}: {name} {other}, the notebook {version}")
    return refused, warned


def refusal(refused: list[str], python_flag: bool) -> str:
    way = "--python names another interpreter on the hosts" if not python_flag else "check the --python given"
    return (
        "; ".join(refused)
        + f": install the notebook's versions there, or start with a Python that has them ({way}); nothing was started"
    )
