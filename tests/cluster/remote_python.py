"""A Python environment of another host's own, for a host that does not see this project's folder.

The project's venv (and the workbench's editable install, which points at the project's
folder) lies inside folders such a host hides, so the host gets what a real one has after
``pip install``: a venv of its own outside them, whose third-party packages are the ones
this machine installed (their ``site-packages`` folder bound to another path in the host's
mount namespace before the folders are hidden, ``SITE`` below) and whose workbench is a copy
of the package tested here, in the venv's own ``site-packages`` with its metadata. Packages
given as ``first`` come before the shared ones (a host that sees another torch version).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

ROOT = pathlib.Path(__file__).resolve().parents[2]


def shared_site() -> str:
    """This machine's third-party packages (the venv's site-packages, links resolved)."""
    return os.path.realpath(sysconfig.get_paths()["purelib"])


def editable_targets() -> list[str]:
    """Folders the venv's editable installs put on the path (the project's folder, here or in main)."""
    out = []
    for pth in pathlib.Path(shared_site()).glob("_editable_impl_*.pth"):
        for line in pth.read_text().splitlines():
            if line.strip() and not line.startswith("import") and os.path.isdir(line.strip()):
                out.append(os.path.realpath(line.strip()))
    return out


def dist_info(site: pathlib.Path, name: str, version: str, top_level: str | None = None) -> None:
    """Installed-package metadata for ``name`` ``version`` in ``site`` (what ``importlib.metadata`` reads)."""
    folder = site / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if top_level:
        (folder / "top_level.txt").write_text(top_level + "\n")


def make_env(dest: pathlib.Path, site_there: str, *, first: pathlib.Path | None = None) -> str:
    """A venv at ``dest`` (outside the hidden folders) with the workbench installed from a copy and
    the shared packages at ``site_there`` (where the host sees them); returns its python."""
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    subprocess.run([base, "-m", "venv", "--without-pip", str(dest)], check=True, capture_output=True)
    py = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    site = dest / "lib" / py / "site-packages"
    shutil.copytree(ROOT / "workbench", site / "workbench", ignore=shutil.ignore_patterns("__pycache__"))
    import workbench

    dist_info(site, "distrain-workbench", workbench.__version__, "workbench")
    lines = ([str(first)] if first is not None else []) + [site_there]
    (site / "host_packages.pth").write_text("\n".join(lines) + "\n")
    return str(dest / "bin" / "python")


def stand_in(folder: pathlib.Path, package: str, version: str) -> pathlib.Path:
    """A package ``package`` that says it is ``version`` (module and metadata), in ``folder``."""
    (folder / package).mkdir(parents=True, exist_ok=True)
    (folder / package / "__init__.py").write_text(f'__version__ = "{version}"\n')
    dist_info(folder, package, version, package)
    return folder
