"""Tier 4: notebooks/01_train_and_watch.ipynb executed headless, outputs checked."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from notebook_runs import outputs_text

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "notebooks" / "01_train_and_watch.ipynb"






def test_lab_01_trains_ddp_then_fsdp2_with_the_dashboard(jupyter_dirs):
    nb = nbformat.read(LAB, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "save the lab without outputs"
    NotebookClient(nb, kernel_name="python3", timeout=180,
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    text = outputs_text(nb)
    assert "2 ranks up" in text
    assert "DDP run: {0: 'finished', 1: 'finished'}" in text
    assert "DDP: 40 steps x 2 ranks streamed" in text
    assert "1 bucket(s), 139,904 bytes" in text
    assert "paused: {0: 'paused', 1: 'paused'}" in text and "stopped: {0: 'stopped', 1: 'stopped'}" in text
    assert re.search(r"learning rates seen: \[0\.0003, 0\.001\]", text)
    assert "FSDP2 run: {0: 'finished', 1: 'finished'}" in text
    assert "FSDP2: 30 steps x 2 ranks" in text and "6 all-gathers, 3 reduce-scatters" in text
    assert "own loop rows: 20" in text and "exported dashboard: True" in text
    m = re.search(r"DDP: .* loss ([\d.]+) -> ([\d.]+)", text)
    assert float(m.group(2)) < float(m.group(1))
    widgets = [o for c in nb.cells for o in c.get("outputs", [])
               if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(widgets) >= 2  # the dashboard was shown for both runs
    assert "ranks stopped" in text
