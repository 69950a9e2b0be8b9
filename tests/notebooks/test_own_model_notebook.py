"""Tier 4: notebooks/03_your_own_model.ipynb executed headless, outputs checked.

A model the notebook defines and a tiny random-init Hugging Face Llama, each laid out as
DDP and FSDP2 and trained with ``%distrain train start``; the Llama exported with
``ckpt export --hf``, loaded back with ``from_pretrained`` and with ``engine.load_pretrained``;
then the Llama as TP (2 ranks), 2D ``fsdp2 tp=2`` and context parallel ``cp=2 dp_shard=2``
(4 ranks), each run's loss at every step equal to the DDP run's (fp32, 1e-5).
"""

from __future__ import annotations

import re
from pathlib import Path

from notebook_runs import executed, outputs_text, saved_notebook_run

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "03_your_own_model.ipynb"
TIMEOUT = 300  # seconds per cell


def test_own_model_and_hf_llama_train_export_and_load_back(request):
    nb = executed(saved_notebook_run(request))
    text = outputs_text(nb)
    for label, steps in (("TinyLM DDP", 12), ("TinyLM FSDP2", 12), ("Llama DDP", 10), ("Llama FSDP2", 10)):
        assert f"{label} run: {{0: 'finished', 1: 'finished'}}" in text, label
        m = re.search(
            rf"{label}: (\d+) steps x 2 ranks, loss ([\d.]+) -> ([\d.]+); process memory rank 0 \d+ MiB, "
            r"rank 1 \d+ MiB",
            text,
        )
        assert m and int(m.group(1)) == steps and float(m.group(3)) < float(m.group(2)), (label, m)
    # the layout summaries: DDP holds the whole model on each rank, FSDP2 half
    held = re.findall(
        r"(ddp|fsdp2) via the .*? parameter bytes held: rank 0 ([\d.]+) MiB, rank 1 ([\d.]+) MiB "
        r"\(whole model ([\d.]+) MiB\)",
        text,
    )
    assert [h[0] for h in held] == ["ddp", "fsdp2", "ddp", "fsdp2"], held
    for kind, r0, r1, whole in held:
        share = 1.0 if kind == "ddp" else 0.5
        assert abs(float(r0) - share * float(whole)) <= 0.02 and abs(float(r1) - share * float(whole)) <= 0.02
    # a layout picture after each prepare (plotly figures)
    figures = [
        c
        for c in nb.cells
        if c.source.startswith("%distrain layout")
        and any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in c.get("outputs", []))
    ]
    assert len(figures) == 7
    # the dashboard came up for every run
    starts = [c for c in nb.cells if c.source.startswith("%distrain train start")]
    assert len(starts) == 7 and all(any(o.get("output_type") == "display_data" for o in c.outputs) for c in starts)
    assert "in the folder: ['config.json', 'model.safetensors']" in text
    assert "exported 39 tensors" in text and "as a Hugging Face LlamaForCausalLM folder" in text
    m = re.search(r"from_pretrained: LlamaForCausalLM, max \|logits - trained logits\| = ([\d.e+-]+)", text)
    assert m and float(m.group(1)) <= 1e-5
    loads = re.findall(r"read ([\d,]+) bytes of ([\d,]+); max \|logits - trained logits\| = ([\d.e+-]+)", text)
    assert len(loads) == 2  # every rank: its half of the file, and the trained model's logits
    for got, total, diff in loads:
        assert int(got.replace(",", "")) < 0.6 * int(total.replace(",", "")) and float(diff) <= 1e-5
    # TP, 2D and CP on the Llama: the same losses as DDP, step by step; what each rank holds
    assert "Llama TP run: {0: 'finished', 1: 'finished'}" in text
    four = "{0: 'finished', 1: 'finished', 2: 'finished', 3: 'finished'}"
    assert f"Llama 2D run: {four}" in text and f"Llama CP run: {four}" in text
    for label in ("Llama FSDP2", "Llama TP", "Llama 2D", "Llama CP"):
        m = re.search(rf"{label} vs Llama DDP: 10 steps, largest relative loss difference ([\d.e+-]+)", text)
        assert m and float(m.group(1)) <= 1e-5, (label, m)
    tp = re.search(
        r"tp via the native path on mesh tp=2; parameter bytes held: rank 0 ([\d.]+) MiB, rank 1 ([\d.]+) MiB "
        r"\(whole model ([\d.]+) MiB\)",
        text,
    )
    assert tp and 0.4 < float(tp.group(1)) / float(tp.group(3)) < 0.6  # half of every projection (norms whole)
    for mesh in ("dp_shard=2 x tp=2", "dp_shard=2 x cp=2"):
        m = re.search(
            rf"via the native path on mesh {mesh}; parameter bytes held: rank 0 ([\d.]+) MiB, rank 1 [\d.]+ MiB, "
            r"rank 2 [\d.]+ MiB, rank 3 [\d.]+ MiB \(whole model ([\d.]+) MiB\)",
            text,
        )
        assert m and abs(float(m.group(1)) - float(m.group(2)) / 4) <= 0.02, (mesh, m)
    assert "ranks stopped" in text
