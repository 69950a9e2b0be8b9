"""The process-role boundary of the design: the notebook side never imports torch
(so the kernel never initialises CUDA and can always start new ranks), and the rank
side never imports widget or plotting libraries."""
import subprocess
import sys

NOTEBOOK_SIDE = """
import sys
import workbench, workbench.magics, workbench.dashboard, workbench.planner, workbench.training
import workbench.metrics, workbench.stream, workbench.planner.live
import workbench.dashboard.layout_figure, workbench.dashboard.plan_figure
import workbench.dashboard.timeline_figure, workbench.dashboard.pipeline_figure, workbench.dashboard.profile_figure
import workbench.dashboard.timeline_panel, workbench.timelines, workbench.profiles
import workbench.registry, workbench.stream.mirror, workbench.labserver.handlers, workbench.labserver.actions
from workbench.commands import load_all
load_all()
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""

RANK_SIDE = """
import sys
import workbench.engine, workbench.engine.trainer, workbench.engine.telemetry, workbench.engine.runtime
import workbench.strategies, workbench.checkpoint, workbench.models, workbench.engine.memory_census
import workbench.engine.timeline, workbench.engine.profiling, workbench.strategies.pipeline
print(sorted(m for m in sys.modules if m.split(".")[0] in ("plotly", "ipywidgets")))
"""


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_notebook_side_never_imports_torch():
    assert _run(NOTEBOOK_SIDE) == "[]"


def test_rank_side_never_imports_widgets_or_plotly():
    assert _run(RANK_SIDE) == "[]"
