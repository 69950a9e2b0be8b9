"""notebooks/02_checkpoint_and_failures.ipynb executed headless (nbclient, python3 kernel)."""

from __future__ import annotations

import re
from pathlib import Path

from notebook_runs import execute_saved_notebook, keep_executed, outputs_text

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "notebooks" / "02_checkpoint_and_failures.ipynb"


def test_lab_02_save_kill_resume_reshard(jupyter_dirs):
    nb = execute_saved_notebook(LAB, timeout=240)
    text = outputs_text(nb)
    assert "4 ranks up" in text and "run: {0: 'finished', 1: 'finished', 2: 'finished', 3: 'finished'}" in text
    assert "step-00000008" in text and "step-00000012" in text  # retention kept the newest 2
    # status names the dead rank and how it died (the exit status is read from the launcher)
    assert re.search(r"rank 3 \(host .*, pid \d+\) killed by SIGKILL", text)
    assert re.search(r"death noticed after [01]\.\d\d s", text)
    m = re.search(r"trainer step after resume: \{(\d+)\}", text)
    assert m and int(m.group(1)) >= 12
    assert "saved as fsdp2 on 4 ranks into ddp on 2 ranks" in text
    assert "2-rank DDP run: {0: 'finished', 1: 'finished'}" in text
    assert "[rank 0]" in text and "exported tensors: 21" in text
    assert "ranks stopped" in text
    keep_executed(LAB.name, nb)
