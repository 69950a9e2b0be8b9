"""Tier 4: notebooks/01_train_and_watch.ipynb executed headless, outputs checked."""

from __future__ import annotations

import re
from pathlib import Path

from notebook_runs import executed, outputs_text, saved_notebook_run

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "01_train_and_watch.ipynb"
TIMEOUT = 180  # seconds per cell


def test_lab_01_trains_ddp_then_fsdp2_with_the_dashboard(request):
    nb = executed(saved_notebook_run(request))
    text = outputs_text(nb)
    assert "2 ranks up" in text
    assert "DDP run: {0: 'finished', 1: 'finished'}" in text
    assert "DDP: 40 steps x 2 ranks streamed" in text
    assert "1 bucket(s), 139,904 bytes" in text
    assert "paused: {0: 'paused', 1: 'paused'}" in text and "stopped: {0: 'stopped', 1: 'stopped'}" in text
    assert re.search(r"learning rates seen: \[0\.0003, 0\.001\]", text)
    assert "FSDP2 run: {0: 'finished', 1: 'finished'}" in text
    assert "FSDP2: 30 steps x 2 ranks" in text and "5 all-gathers, 3 reduce-scatters" in text
    assert "own loop rows: 20" in text and "exported dashboard: True" in text
    m = re.search(r"DDP: .* loss ([\d.]+) -> ([\d.]+)", text)
    assert float(m.group(2)) < float(m.group(1))
    # the dashboard was shown for both runs, live where it was shown last; the first says it moved
    shown = {
        i: [o for o in c.get("outputs", []) if o.get("output_type") == "display_data"]
        for i, c in enumerate(nb.cells)
        if "%distrain train start" in c.source
    }
    (ddp, fsdp2) = shown.values()
    assert [list(o["data"]) for o in ddp] == [["text/plain", "text/html"]]
    assert "the live dashboard moved" in ddp[0]["data"]["text/html"]
    assert len(fsdp2) == 1 and "application/vnd.jupyter.widget-view+json" in fsdp2[0]["data"]
    assert "ranks stopped" in text
