"""The workbench package as an environment check sees it, on the notebook and on a rank alike:
its distribution's version and a digest of its sources (two copies of one version can differ)."""

from __future__ import annotations

import functools
import os
import re

from .code_tree import source_digest

DISTRIBUTION = "distrain-workbench"
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def versions(names) -> dict[str, str | None]:
    """distribution name -> the version this Python imports (None: not installed); a workbench
    copied without its metadata answers with its package's ``__version__``."""
    from importlib import metadata

    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = _own_version() if name == DISTRIBUTION else None
    return out


def _own_version() -> str | None:
    with open(os.path.join(PACKAGE_DIR, "__init__.py")) as fh:  # read, not imported: no import above
        found = re.search(r'^__version__ = "([^"]+)"', fh.read(), re.M)
    return found.group(1) if found else None


@functools.cache
def digest() -> str:
    return source_digest(PACKAGE_DIR)
