"""Hugging Face weights in and out of laid-out models (real gloo ranks; no hub access).

Out: a tiny random-init Llama trained under FSDP2 on the shared 4-rank set, checkpointed,
exported with ``ckpt export --hf`` and loaded by ``transformers``' ``from_pretrained``:
its logits equal the trained model's. In: a ``save_pretrained`` folder read into an
FSDP2-sharded model (each rank reads its own slice): the same logits as the HF model.
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import clean_trainer

from workbench.notebook import checkpoints as ck

LLAMA = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from workbench import engine
_hw_cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
_hw_ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(7))
"""

CLEAN = """
for _n in [n for n in list(globals()) if n.startswith('_hw_')]:
    del globals()[_n]
from workbench.engine import session as _s
_s.clear()
"""


@pytest.fixture
def rs4(ranks4):
    yield ranks4
    ranks4.apply(clean_trainer, timeout=60)
    ranks4.execute(CLEAN, timeout=60)


@pytest.fixture
def rs2(ranks2):
    yield ranks2
    ranks2.apply(clean_trainer, timeout=60)
    ranks2.execute(CLEAN, timeout=60)


def refused(rs, code: str) -> list[str]:
    """Run ``code`` on every rank, expecting it to raise there; each rank's message.

    (Caught on the ranks: an execute's error reaches the notebook on another channel than
    its reply, so a RankFailure can lose the race to the reply.)"""
    rs.execute(
        "try:\n    " + code + "\n    _hw_err = None\nexcept Exception as e:\n    _hw_err = f'{type(e).__name__}: {e}'",
        timeout=60,
    )
    errs = rs.pull("_hw_err")
    assert all(errs), f"{code} was not refused: {errs}"
    return errs


def test_fsdp2_x4_checkpoint_exports_a_folder_from_pretrained_loads_with_equal_logits(rs4, shell, tmp_path):
    rs4.execute(
        LLAMA
        + """
torch.manual_seed(0)
_hw_prep = engine.prepare(LlamaForCausalLM(_hw_cfg), lambda ps: torch.optim.AdamW(ps, lr=1e-2), "fsdp2")
_hw_t = engine.Trainer(_hw_prep, data=lambda i: {"input_ids": _hw_ids, "labels": _hw_ids})
_hw_t.start(3)
_hw_t.wait(120)
with torch.no_grad():
    _hw_logits = _hw_prep.model(input_ids=_hw_ids).logits
""",
        timeout=240,
    )
    assert rs4.pull("_hw_t.state") == ["finished"] * 4
    root, out = str(tmp_path / "ckpt"), str(tmp_path / "hf")
    ck.save(root=root, rankset=rs4)
    shell.run_line_magic("distrain", f"ckpt export {out} --hf --dir {root}")
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    with open(os.path.join(out, "config.json")) as fh:
        cfg = json.load(fh)
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 2
    rs4.execute(
        f"""
_hw_back = LlamaForCausalLM.from_pretrained({out!r})
with torch.no_grad():
    _hw_diff = float((_hw_back(input_ids=_hw_ids).logits - _hw_logits).abs().max())
_hw_moved = float((_hw_back.lm_head.weight - LlamaForCausalLM(_hw_cfg).lm_head.weight).abs().max())
""",
        ranks=[0],
        timeout=120,
    )
    diff, moved = rs4.pull("(_hw_diff, _hw_moved)", ranks=[0])[0]
    assert diff <= 1e-5, diff
    assert moved > 1e-3  # the trained weights, not a fresh init


def test_save_pretrained_folder_loads_into_an_fsdp2_sharded_model_each_rank_its_slice(rs2, tmp_path):
    folder = str(tmp_path / "pretrained")
    rs2.execute(
        LLAMA
        + f"""
torch.manual_seed(1)
_hw_src = LlamaForCausalLM(_hw_cfg)
if engine.rank == 0:
    _hw_src.save_pretrained({folder!r})
engine.barrier()
with torch.no_grad():
    _hw_want = _hw_src(input_ids=_hw_ids).logits
torch.manual_seed(2)   # other weights: the load must replace all of them
_hw_prep = engine.prepare(LlamaForCausalLM(_hw_cfg), lambda ps: torch.optim.AdamW(ps, lr=1e-2), "fsdp2")
with torch.no_grad():
    _hw_before = float((_hw_prep.model(input_ids=_hw_ids).logits - _hw_want).abs().max())
_hw_info = engine.load_pretrained({folder!r})
with torch.no_grad():
    _hw_after = float((_hw_prep.model(input_ids=_hw_ids).logits - _hw_want).abs().max())
""",
        timeout=240,
    )
    before, after = zip(*rs2.pull("(_hw_before, _hw_after)"))
    assert min(before) > 1e-2 and max(after) <= 1e-6, (before, after)
    infos = rs2.pull("_hw_info")
    total = os.path.getsize(os.path.join(folder, "model.safetensors"))
    for info in infos:  # each rank read what it holds: its shards, about half of the model
        assert info["bytes_read"] == info["bytes_held"] < 0.6 * total
        assert info["tensors"] == 21 and info["unexpected"] == []
    assert sum(i["bytes_read"] for i in infos) < 1.01 * total


def test_a_folder_of_another_model_is_refused_naming_the_tensors_and_leaves_the_model(rs2, tmp_path):
    folder = str(tmp_path / "other")
    rs2.execute(
        LLAMA
        + f"""
from transformers import LlamaConfig
if engine.rank == 0:
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=4, num_key_value_heads=2)).save_pretrained({folder!r})
engine.barrier()
torch.manual_seed(0)
_hw_prep = engine.prepare(LlamaForCausalLM(_hw_cfg), lambda ps: torch.optim.AdamW(ps, lr=1e-2), "fsdp2")
_hw_keep = {{n: p.full_tensor().clone() for n, p in _hw_prep.model.named_parameters()}}
""",
        timeout=240,
    )
    text = " ".join(refused(rs2, f"engine.load_pretrained({folder!r})"))
    assert "does not fit this model" in text and "not in the folder: model.layers.1." in text
    assert "model.embed_tokens.weight: (64, 48) in the folder, (64, 32) in the model" in text
    rs2.execute(
        "_hw_same = all(torch.equal(p.full_tensor(), _hw_keep[n]) for n, p in _hw_prep.model.named_parameters())",
        timeout=60,
    )
    assert rs2.pull("_hw_same") == [True, True]
    assert all("has no model.safetensors" in m for m in refused(rs2, f"engine.load_pretrained({str(tmp_path)!r})"))


def test_a_safetensors_folder_loads_into_tp_and_2d_layouts_each_rank_its_slice(rs4, tmp_path):
    """The same reader on tensor-parallel shards (boxes of rows or columns) and on FSDP2 over TP
    (the teaching GPT, whose own TP plan works today): the logits of the saved model."""
    folder = str(tmp_path / "gpt")
    rs4.execute(
        f"""
import os
import torch
from safetensors.torch import save_file
from workbench import engine
from workbench.models import GPT, GPTConfig
torch.manual_seed(1)
_hw_src = GPT(GPTConfig.tiny(n_kv_heads=4))
if engine.rank == 0:
    os.makedirs({folder!r}, exist_ok=True)
    save_file({{k: v.contiguous() for k, v in _hw_src.state_dict().items()}},
              os.path.join({folder!r}, "model.safetensors"), metadata={{"format": "pt"}})
engine.barrier()
_hw_x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))
with torch.no_grad():
    _hw_want = _hw_src(_hw_x)
_hw_res = {{}}
for spec in ("tp", "fsdp2_tp tp=2"):
    torch.manual_seed(2)
    p = engine.prepare(GPT(GPTConfig.tiny(n_kv_heads=4)), lambda ps: torch.optim.AdamW(ps), spec)
    info = engine.load_pretrained({folder!r})
    with torch.no_grad():
        out = p.model(_hw_x)
    _hw_res[spec] = (float((out - _hw_want).abs().max()), info["bytes_read"], info["bytes_held"])
""",
        timeout=240,
    )
    total = os.path.getsize(os.path.join(folder, "model.safetensors"))
    for res in rs4.pull("_hw_res"):
        for spec, (diff, read, held) in res.items():
            assert diff <= 1e-5, (spec, diff)
            assert read == held < 0.6 * total, (spec, read, held, total)
