"""Fine-tuning data on real gloo ranks: a local JSONL file and tokenizer folder, packed rows
sharded over 2 data-parallel ranks by the trainer, the same batches and losses after a
checkpoint restore, with a peft LoRA model under FSDP2."""

from __future__ import annotations

import json

import pytest
from conftest import clean_trainer

from workbench.notebook import checkpoints as ck

BUILD = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from peft import LoraConfig, get_peft_model
from workbench import engine
_sf_ds = engine.sft_dataset({data!r}, {tok!r}, max_len=128, pack=True)
torch.manual_seed(0)
_sf_cfg = LlamaConfig(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
_sf_model = get_peft_model(LlamaForCausalLM(_sf_cfg), LoraConfig(r=4, target_modules="all-linear"))
_sf_prep = engine.prepare(_sf_model, lambda ps: torch.optim.AdamW(ps, lr=1e-2), "fsdp2")
_sf_seen = {{}}
def _sf_step(model, batch):
    import workbench.engine.trainer as _tr
    loss = model(**batch).loss
    _sf_seen[_tr.current().step + 1] = (batch["input_ids"].tolist(), batch["position_ids"].tolist(), float(loss))
    return loss
_sf_t = engine.Trainer(_sf_prep, data=_sf_ds, batch_size=4, collate_fn=_sf_ds.collate, step_fn=_sf_step)
_sf_t.start(2)
_sf_t.wait(60)
"""


@pytest.fixture
def rs(ranks2):
    yield ranks2
    ranks2.apply(clean_trainer, timeout=60)
    ranks2.execute(
        "for _n in [n for n in list(globals()) if n.startswith('_sf_')]:\n    del globals()[_n]\n"
        "from workbench.engine import session as _s\n_s.clear()",
        timeout=60,
    )


def test_packed_sft_rows_are_sharded_over_ranks_and_a_restore_gives_the_same_batches(rs, tmp_path):
    from workbench.models.data import load_corpus
    from workbench.models.tokenizer import train_tokenizer

    tok = train_tokenizer(str(tmp_path / "tok"), vocab_size=1000)
    lines = [ln.strip() for ln in load_corpus().splitlines() if 15 < len(ln.strip()) < 60][:120]
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"Continue: {a}", "completion": b}) + "\n" for a, b in zip(lines, lines[1:]))
    )
    rs.execute(BUILD.format(data=str(data), tok=tok), timeout=300)
    assert rs.pull("_sf_t.state") == ["finished"] * 2, rs.pull("_sf_t.status()")
    first = rs.pull("_sf_seen")
    for s in range(1, 3):  # each rank its own 2 of the global 4 rows, every row full (packed)
        assert first[0][s][0] != first[1][s][0]
        assert all(len(row) == 128 for r in first for row in r[s][0])
    n = len(lines) - 1
    assert rs.pull("_sf_ds.describe()")[0].startswith(f"{n} examples")
    assert rs.pull("len(_sf_ds)")[0] < 0.7 * n  # packed: several examples a row

    root = str(tmp_path / "ckpt")
    info = ck.save(root=root, rankset=rs)  # at step 2
    rs.execute("_sf_t.start(2); _sf_t.wait(120)", timeout=180)
    after = rs.pull("_sf_seen")
    ck.load(info["name"], root=root, rankset=rs)
    rs.execute("_sf_seen.clear(); _sf_t.start(2); _sf_t.wait(120)", timeout=180)
    again = rs.pull("_sf_seen")
    for r in (0, 1):  # the same rows, positions and losses on each rank after the restore
        for s in (3, 4):
            assert again[r][s][:2] == after[r][s][:2], (r, s)
            assert again[r][s][2] == pytest.approx(after[r][s][2], rel=1e-6, abs=1e-7)
