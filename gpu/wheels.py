"""The wheels a GPU machine lacks: the closure of the workbench's rank/test needs minus what it holds.

The device's own package list (``gpu/device_packages.txt``, as read there) holds torch (CUDA),
accelerate, transformers, pandas, psutil, pyarrow, mpi4py, pytest and more. Versions are this
venv's, so the downloaded wheels are the ones the suite here runs on. ``python gpu/wheels.py`` prints
``name==version`` lines for ``pip download``.
"""

from __future__ import annotations

import os
import re
from importlib import metadata

from packaging.markers import Marker
from packaging.requirements import Requirement

DEVICE_LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "device_packages.txt")
# what the ranks and `-m gpu` tests import beyond the device's packages
NEEDED = (
    "ipyparallel",
    "ipython",
    "ipykernel",
    "pyzmq",
    "tornado",
    "traitlets",
    "deepspeed",
    "pytest",
    "pytest-timeout",
    "xxhash",
    "safetensors",
    "torchao",  # fp8 training (Float8Linear)
)
TARGET_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requires(name: str) -> list[str]:
    """Names ``name`` needs on the target (markers evaluated for CPython 3.12 on Linux, no extras)."""
    out = []
    for text in metadata.requires(name) or []:
        req = Requirement(text)
        if req.marker is None or Marker(str(req.marker)).evaluate(TARGET_ENV):
            out.append(norm(req.name))
    return out


def on_device() -> set[str]:
    with open(DEVICE_LIST) as f:
        return {norm(line.strip()) for line in f if line.strip() and not line.startswith("#")}


def missing() -> dict[str, str]:
    """name -> version of every distribution the device lacks (the closure of NEEDED, stopping
    at what the device holds), sorted by name."""
    have, seen = on_device(), set()
    todo = [norm(r) for r in NEEDED]
    while todo:
        n = todo.pop()
        if n in seen or n in have:
            continue
        seen.add(n)
        todo.extend(requires(n))
    return {n: metadata.version(n) for n in sorted(seen)}


if __name__ == "__main__":
    for n, v in missing().items():
        print(f"{n}=={v}")
