"""peft LoRA adapters under DDP and FSDP2 on real gloo ranks: checkpoints, restore, export.

A tiny random Llama wrapped by peft (``target_modules="all-linear"``): a checkpoint holds the
adapters and their AdamW state, the frozen base is written once under the root's ``bases/``;
a restore continues with the same losses and refuses another base; ``ckpt export --hf``
writes peft's adapter folder (``PeftModel.from_pretrained`` gives the trained logits) and
``--merged`` a model folder ``from_pretrained`` loads.
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import clean_trainer

from workbench.notebook import checkpoints as ck
from workbench.shared.checkpoint.manifest import read_manifest

BUILD = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from peft import LoraConfig, PeftModel, get_peft_model
from workbench import engine
from workbench.engine import checkpoint_hooks as ch
_lo_cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
_lo_ids = torch.randint(0, 256, (4, 12), generator=torch.Generator().manual_seed(7))
def _lo_base():
    torch.manual_seed(0)
    return LlamaForCausalLM(_lo_cfg)
_lo_model = get_peft_model(_lo_base(), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
_lo_prep = engine.prepare(_lo_model, lambda ps: torch.optim.AdamW(ps, lr=1e-2), {spec!r})
_lo_state = ch.track(_lo_prep)
_lo_losses = {{}}
def _lo_train(n):
    for _ in range(n):
        s = _lo_state.step
        mine = _lo_ids[_lo_prep.dp_rank * 2 : _lo_prep.dp_rank * 2 + 2].roll(s, dims=1)
        _lo_prep.optimizer.zero_grad(set_to_none=True)
        out = _lo_prep.model(input_ids=mine, labels=mine)
        out.loss.backward()
        _lo_prep.optimizer.step()
        _lo_losses[s] = float(out.loss)
        ch.step_done(_lo_losses[s])
def _lo_logits():
    with torch.no_grad():
        out = _lo_prep.model(input_ids=_lo_ids).logits
    return out.full_tensor() if hasattr(out, "full_tensor") else out
"""

CLEAN = """
from workbench.engine import checkpoint_hooks as ch
ch.untrack()
for _n in [n for n in list(globals()) if n.startswith('_lo_')]:
    del globals()[_n]
"""


@pytest.fixture
def lo2(ranks2):
    yield ranks2
    ranks2.apply(clean_trainer, timeout=60)
    ranks2.execute(CLEAN, timeout=60)


def _tensor_bytes(m) -> int:
    n = 0
    for shape, dtype in list(m.model_tensors.values()) + list(m.optim_tensors.values()):
        count = 1
        for d in shape:
            count *= d
        n += count * (8 if dtype in ("float64", "int64") else 4)
    return n


def _files(folder: str) -> dict:
    return {n: os.stat(os.path.join(folder, n)).st_mtime_ns for n in sorted(os.listdir(folder))}


@pytest.mark.parametrize("spec", ["fsdp2", "ddp"])
def test_lora_checkpoint_holds_adapters_base_once_restores_equal_losses_exports_for_peft(lo2, shell2, tmp_path, spec):
    rs = lo2
    root = str(tmp_path / "ckpt")
    rs.execute(BUILD.format(spec=spec) + "_lo_train(3)", timeout=240)
    info = ck.save(root=root, rankset=rs)
    m = read_manifest(info["path"])
    assert m.adapter["name"] == "default" and m.adapter["config"]["r"] == 4
    assert m.model_tensors and all(".lora_" in k for k in m.model_tensors), sorted(m.model_tensors)[:4]
    assert m.optim_tensors and all(".lora_" in k for k in m.optim_tensors)
    bases = os.listdir(os.path.join(root, "bases"))
    assert bases == [m.adapter["base"]["fingerprint"]]
    base_dir = os.path.join(root, "bases", bases[0])
    written = _files(base_dir)
    assert {"config.json", "base.json", "model.safetensors.index.json"} <= set(written)

    rs.execute("_lo_train(3)", timeout=120)  # steps 3..5: the reference
    ref = rs.pull("[_lo_losses[s] for s in (3, 4, 5)]")[0]
    info2 = ck.save(tag="later", root=root, rankset=rs)
    assert _files(base_dir) == written and os.listdir(os.path.join(root, "bases")) == bases  # not again
    later = read_manifest(info2["path"])
    assert later.adapter["base"]["fingerprint"] == bases[0] and later.bytes < 1.1 * m.bytes

    ck.load(3, root=root, rankset=rs)
    rs.execute("_lo_train(3)", timeout=120)
    got = rs.pull("[_lo_losses[s] for s in (3, 4, 5)]")[0]
    assert got == pytest.approx(ref, rel=1e-6, abs=1e-7)

    adapter, merged = str(tmp_path / "adapter"), str(tmp_path / "merged")
    shell2.run_line_magic("distrain", f"ckpt export {adapter} later --hf --dir {root}")
    assert sorted(os.listdir(adapter)) == ["adapter_config.json", "adapter_model.safetensors"]
    with open(os.path.join(adapter, "adapter_config.json")) as fh:
        assert json.load(fh)["peft_type"] == "LORA"
    shell2.run_line_magic("distrain", f"ckpt export {merged} later --merged --dir {root}")
    ck.load("later", root=root, rankset=rs)
    rs.execute("_lo_want = _lo_logits()", timeout=120)
    rs.execute(
        f"""
_lo_peft = PeftModel.from_pretrained(_lo_base(), {adapter!r})
_lo_merged = LlamaForCausalLM.from_pretrained({merged!r})
with torch.no_grad():
    _lo_d_adapter = float((_lo_peft(input_ids=_lo_ids).logits - _lo_want).abs().max())
    _lo_d_merged = float((_lo_merged(input_ids=_lo_ids).logits - _lo_want).abs().max())
    _lo_d_base = float((_lo_base()(input_ids=_lo_ids).logits - _lo_want).abs().max())
""",
        ranks=[0],
        timeout=120,
    )
    d_adapter, d_merged, d_base = rs.pull("(_lo_d_adapter, _lo_d_merged, _lo_d_base)", ranks=[0])[0]
    assert d_adapter <= 1e-5 and d_merged <= 1e-5, (d_adapter, d_merged)
    assert d_base > 1e-3  # the adapters trained: without them the logits differ


def test_lora_checkpoint_is_small_refuses_another_base_and_loads_into_ddp_on_the_saved_base(lo2, tmp_path):
    rs = lo2
    root = str(tmp_path / "ckpt")
    rs.execute(BUILD.format(spec="fsdp2") + "_lo_train(1)\n_lo_saved = _lo_logits()", timeout=240)
    lora = read_manifest(ck.save(tag="lora", root=root, rankset=rs)["path"])
    rs.apply(clean_trainer, timeout=60)
    rs.execute(  # the same base trained whole: every tensor and its AdamW state
        """
_lo_prep = engine.prepare(_lo_base(), lambda ps: torch.optim.AdamW(ps, lr=1e-2), "fsdp2")
_lo_state = ch.track(_lo_prep)
_lo_train(1)
""",
        timeout=240,
    )
    full = read_manifest(ck.save(tag="full", root=root, rankset=rs)["path"])
    base = sum(
        os.path.getsize(os.path.join(root, "bases", lora.adapter["base"]["fingerprint"], n))
        for n in os.listdir(os.path.join(root, "bases", lora.adapter["base"]["fingerprint"]))
    )
    fraction = lora.bytes / full.bytes
    tensors = _tensor_bytes(lora) / _tensor_bytes(full)
    print(f"LoRA checkpoint {lora.bytes} B, full {full.bytes} B: {fraction:.3f} ({tensors:.3f} of the tensor bytes)")
    assert tensors < 0.06, tensors  # 16,384 adapter parameters against 361,088 (AdamW state alike)
    assert fraction < 0.10, fraction  # plus each save's rank files (RNG state) and metadata
    assert base < 0.45 * full.bytes  # the base alone: weights without optimizer state

    rs.apply(clean_trainer, timeout=60)
    rs.execute(  # the same adapters on another base (other random weights)
        """
torch.manual_seed(1)
_lo_model = get_peft_model(LlamaForCausalLM(_lo_cfg), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
_lo_prep = engine.prepare(_lo_model, lambda ps: torch.optim.AdamW(ps, lr=1e-2), "fsdp2")
_lo_state = ch.track(_lo_prep)
_lo_before = _lo_logits()
""",
        timeout=240,
    )
    with pytest.raises(Exception, match="trained on frozen base") as err:
        ck.load("lora", root=root, rankset=rs)
    assert lora.adapter["base"]["fingerprint"] in str(err.value) and "nothing was loaded" in str(err.value)
    rs.execute("_lo_same = bool(torch.equal(_lo_logits(), _lo_before))", timeout=120)
    assert rs.pull("_lo_same") == [True, True]

    rs.apply(clean_trainer, timeout=60)
    base_dir = os.path.join(root, "bases", lora.adapter["base"]["fingerprint"])
    rs.execute(  # another base under DDP, the saved one read into it: then the FSDP2 adapters reshard into it
        f"""
torch.manual_seed(1)
_lo_model = get_peft_model(LlamaForCausalLM(_lo_cfg), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
_lo_prep = engine.prepare(_lo_model, lambda ps: torch.optim.AdamW(ps, lr=1e-2), "ddp")
_lo_state = ch.track(_lo_prep)
_lo_read = engine.load_pretrained({base_dir!r})
""",
        timeout=240,
    )
    assert [r["tensors"] for r in rs.pull("_lo_read")] == [lora.adapter["base"]["tensors"]] * 2
    ck.load("lora", root=root, rankset=rs)
    rs.execute("_lo_diff = float((_lo_logits() - _lo_saved).abs().max())", timeout=120)
    assert max(rs.pull("_lo_diff")) <= 1e-5


def test_async_auto_saves_of_a_lora_run_write_the_base_once(lo2, tmp_path):
    rs = lo2
    root = str(tmp_path / "auto")
    rs.execute(
        BUILD.format(spec="fsdp2")
        + """
_lo_t = engine.Trainer(_lo_prep, data=lambda i: {"input_ids": _lo_ids[:2].roll(i, 1), "labels": _lo_ids[:2].roll(i, 1)})
""",
        timeout=240,
    )
    ck.autosave(2, keep=3, async_=True, root=root, rankset=rs)
    try:
        rs.execute("_lo_t.start(6); _lo_t.wait(120)", timeout=180)
        ck.wait(rankset=rs)
    finally:
        ck.autosave(None, rankset=rs)
    assert rs.pull("_lo_t.state") == ["finished"] * 2
    saved = [read_manifest(os.path.join(root, n)) for n in sorted(os.listdir(root)) if n.startswith("step-")]
    assert [m.step for m in saved] == [2, 4, 6] and all(m.auto and m.async_save for m in saved)
    assert len({m.adapter["base"]["fingerprint"] for m in saved}) == 1
    assert os.listdir(os.path.join(root, "bases")) == [saved[0].adapter["base"]["fingerprint"]]
    assert all(all(".lora_" in k for k in m.model_tensors) for m in saved)
