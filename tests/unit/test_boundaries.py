"""The process-role boundary of the design, over every module of every package: the notebook
side never imports torch (so the kernel never initialises CUDA and can always start new
ranks), the rank side never imports the notebook side or widget/plotting libraries, and
the shared and planner packages import neither side's libraries. Each check imports every
module of its packages in a fresh interpreter and reads ``sys.modules`` (transitively); the
same on ranks that worked: tests/ranks/test_worked_ranks.py."""

import subprocess
import sys

import pytest

WALK = """
import importlib, pkgutil, sys
packages = {packages!r}
for name in packages:
    pkg = importlib.import_module(name)
    for m in pkgutil.walk_packages(pkg.__path__, name + "."):
        if m.name not in {skip!r}:
            importlib.import_module(m.name)
{extra}
banned = {banned!r}
print(sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in banned)))
"""

NOTEBOOK_EXTRA = """
import workbench
for name in workbench.__all__:
    getattr(workbench, name)  # the lazy public API, as `%load_ext workbench` users reach it
from workbench.notebook.commands import load_all
load_all()
"""

CASES = {
    # the kernel: the notebook package, the public API, the Lab server extension
    "notebook": (["workbench.notebook", "workbench.labserver"], ["workbench.notebook.demo"], NOTEBOOK_EXTRA, ["torch"]),
    # the ranks: engine (rpc included), strategies, models
    "engine": (
        ["workbench.engine", "workbench.strategies", "workbench.models"],
        [],
        "",
        ["workbench.notebook", "workbench.labserver", "plotly", "ipywidgets", "IPython.display"],
    ),
    # pure parts both sides import
    "shared": (
        ["workbench.shared", "workbench.planner"],
        [],
        "",
        ["torch", "workbench.notebook", "workbench.engine", "plotly", "ipywidgets"],
    ),
}


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("side", sorted(CASES))
def test_every_module_of_a_side_imports_nothing_of_the_other_side(side):
    packages, skip, extra, banned = CASES[side]
    assert _run(WALK.format(packages=packages, skip=skip, extra=extra, banned=banned)) == "[]"


def test_import_workbench_alone_loads_nothing_but_the_package():
    code = "import sys, workbench; print(sorted(m for m in sys.modules if m.startswith('workbench')))"
    assert _run(code) == "['workbench']"
