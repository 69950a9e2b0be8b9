"""Tier 4: notebooks/04_finetune.ipynb executed headless, outputs checked.

LoRA SFT of a small local Llama on a local instruction file under FSDP2 (2 ranks): the
data's prompt tokens masked, the adapters trained (the loss goes down), checkpoints holding
the adapters with the base written once, restored, exported as peft's adapter folder and
merged, both loaded back with the trained logits and sampled from; then trl's SFTTrainer in
``%%distrain`` on the same ranks, its steps in ``workbench.metrics()``.
"""

from __future__ import annotations

import re
from pathlib import Path

from notebook_runs import executed, outputs_text, saved_notebook_run

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "04_finetune.ipynb"
TIMEOUT = 300  # seconds per cell


def test_lora_sft_checkpoint_export_and_trl_on_the_same_ranks(request):
    nb = executed(saved_notebook_run(request))
    text = outputs_text(nb)
    assert "160 conversations" in text
    m = re.search(r"(\d+) examples, (\d+) tokens \((\d+) trained on, the rest prompt\), packed into (\d+) rows", text)
    assert m and int(m.group(1)) == 160 and int(m.group(3)) < int(m.group(2)) / 2 and int(m.group(4)) < 160, m
    assert "trained tokens of row 0: '" in text and "<|im_start|>" not in text.split("trained tokens of row 0:")[1][:40]
    m = re.search(r"trainable parameters: ([\d,]+) of ([\d,]+)", text)
    assert m and int(m.group(1).replace(",", "")) < 0.2 * int(m.group(2).replace(",", ""))
    assert "LoRA run: {0: 'finished', 1: 'finished'}" in text
    m = re.search(r"LoRA SFT: (\d+) steps x 2 ranks, loss ([\d.]+) -> ([\d.]+)", text)
    assert m and int(m.group(1)) == 16 and float(m.group(3)) < float(m.group(2)), m
    m = re.search(r"bases written: (\d+); checkpoint (\d+) KiB, base once (\d+) KiB", text)
    assert m and m.group(1) == "1" and int(m.group(2)) < int(m.group(3)), m
    assert "restored at step 16" in text
    assert "adapter folder: ['adapter_config.json', 'adapter_model.safetensors']" in text
    assert "as a peft LORA adapter folder" in text and "(adapter merged into its base)" in text
    for what in ("PeftModel.from_pretrained", "merged from_pretrained"):
        m = re.search(rf"{what}: max \|logits - trained logits\| = ([\d.e+-]+)", text)
        assert m and float(m.group(1)) <= 1e-5, (what, m)
    assert "sampled: '" in text
    m = re.search(r"trl SFTTrainer: world size 2, 6 steps, loss ([\d.]+)", text)
    assert m, text[-3000:]
    m = re.search(r"on the dashboard: run '([^']+)', (\d+) steps x 2 ranks", text)
    assert m and int(m.group(2)) == 6, m
