"""fp8 training and NCCL settings on real CPU ranks.

fp8: torchao's emulation (``fp8_emulate=true``: the same E4M3/E5M2 casts and scales, matmuls in
high precision, since this machine has no fp8 hardware) through ``prepare`` on two gloo ranks:
the conversion, the layout's marks, torchao's fp8 all-gather under FSDP2, TP, and the loss over
20 steps against the same model in fp32 (every step within 3%, the last within 1%: fp8 keeps a
3-bit mantissa forward and 2 bits for gradients; the rounding shows early and fades as AdamW
settles). NCCL: settings given to ``%distrain start`` reach every rank's environment before
its process group starts and show in ``%distrain status``; a bad one starts nothing.
"""

import psutil
import pytest
from gloo_harness import run_ranks

from workbench.notebook.commands import UsageError, dispatch

STEPS = 20
STEP_REL, LAST_REL = 0.03, 0.01


def _train(spec: str, rank: int, cfg_kw: dict, steps: int = STEPS):
    import torch

    from workbench.models import GPT, GPTConfig, TextDataset, batches
    from workbench.strategies import prepare

    torch.manual_seed(0)
    model = GPT(GPTConfig.tiny(**cfg_kw))
    p = prepare(model, lambda ps: torch.optim.AdamW(ps, lr=1e-2), spec)
    losses = [p.train_step(b) for b in batches(TextDataset(32), 8, p.dp_rank, p.dp_size, seed=1, steps=steps)]
    return model, p, losses


def fp8_on_two_ranks(rank, world):
    import torch
    from torchao.float8.float8_linear import Float8Linear

    from workbench.models import GPT, GPTConfig
    from workbench.strategies import PrepareError, prepare

    dims = dict(dim=64, ffn_dim=128)  # every block linear a multiple of 16, also per tp rank
    out = {"fp32": _train("fsdp2", rank, dims)[2]}
    model, p, out["fsdp2_tensorwise"] = _train("fsdp2 fp8=tensorwise fp8_emulate=true", rank, dims)
    out["converted"] = sorted(n for n, m in model.named_modules() if isinstance(m, Float8Linear))
    out["compute"] = {e["name"]: e.get("compute") for e in p.layout["params"]}
    out["notes"] = p.layout["notes"]
    # FSDP2 all-gathers torchao's fp8 weight subclass (tensorwise), not the fp32 shard
    w = model.layers["0"].attention.wq.weight
    out["gathered_as"] = type(w.to_local()).__name__
    p.close()
    model, p, out["tp_rowwise"] = _train("tp fp8=rowwise fp8_emulate=true", rank, dims)
    out["tp_compute"] = p.layout["params"][2].get("compute"), p.layout["params"][2]["placements"]
    p.close()
    model, p, _ = _train("none fp8=rowwise fp8_emulate=true", rank, dims, steps=2)  # no parallelism
    out["none_converted"] = sum(isinstance(m, Float8Linear) for m in model.modules())
    out["none_marked"] = sum(1 for e in p.layout["params"] if e.get("compute") == "fp8 rowwise (emulated)")
    p.close()
    # tp=2 halves wk's 16 outputs to 8 per rank: refused before the model changes
    torch.manual_seed(0)
    small = GPT(GPTConfig.tiny())
    try:
        prepare(small, lambda ps: torch.optim.AdamW(ps), "tp fp8=rowwise fp8_emulate=true")
        out["refusal"] = None
    except PrepareError as e:
        out["refusal"] = str(e)
    out["untouched"] = not any(isinstance(m, Float8Linear) for m in small.modules()) and all(
        type(q) is torch.nn.Parameter for q in small.parameters()
    )
    return out


def test_fp8_emulated_on_cpu_ranks_converts_lays_out_and_trains_within_tolerance_of_fp32():
    res = run_ranks(fp8_on_two_ranks, 2, timeout=600)
    r = res[0]
    assert [x["fp32"] for x in res] == [r["fp32"]] * 2  # the loss is averaged over ranks: the same on both
    blocks = [
        f"layers.{i}.{m}" for i in (0, 1) for m in ("attention.wq", "attention.wk", "attention.wv", "attention.wo")
    ]
    blocks += [f"layers.{i}.feed_forward.w{j}" for i in (0, 1) for j in (1, 2, 3)]
    assert r["converted"] == sorted(blocks)  # block linears only: the embedding and head stay
    assert r["compute"]["layers.0.attention.wq.weight"] == "fp8 tensorwise (emulated)"
    assert r["compute"]["tok_embeddings.weight"] is None and r["compute"]["output.weight"] is None
    assert r["compute"]["layers.0.attention_norm.weight"] is None
    assert any("weights all-gathered in fp8" in n for n in r["notes"])
    assert r["gathered_as"] == "WeightWithDynamicFloat8CastTensor"
    assert r["tp_compute"] == ("fp8 rowwise (emulated)", ["Shard(0)"])
    for name in ("fsdp2_tensorwise", "tp_rowwise"):
        fp8, ref = r[name], r["fp32"]
        rel = [abs(a - b) / b for a, b in zip(fp8, ref)]
        assert len(fp8) == STEPS and max(rel) < STEP_REL, (name, rel)
        assert rel[-1] < LAST_REL, (name, rel)
        assert max(rel) > 1e-4, name  # the casts really ran: fp8 is not fp32
    assert r["refusal"] == (
        "fp8='rowwise': fp8 matmuls need both dimensions of every block linear divisible by 16; not: "
        "layers.0.attention.wk (32->8 per tp rank), layers.0.attention.wv (32->8 per tp rank), "
        "layers.1.attention.wk (32->8 per tp rank), layers.1.attention.wv (32->8 per tp rank). "
        "Use model dimensions that are multiples of 16 x tp, or drop fp8"
    )
    assert r["untouched"]
    assert r["none_converted"] == r["none_marked"] == 14


# ------------------------------------------------------------------------------------ NCCL
@pytest.fixture
def shell(fresh_ranks):
    """A real IPython shell with ``%load_ext workbench``; fresh_ranks stops what the test starts."""
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "workbench")
    return ip


def test_nccl_settings_reach_every_rank_before_it_starts_and_status_shows_them(shell, fresh_ranks):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(UsageError, match=r"unknown setting 'ALOG' \(did you mean NCCL_ALGO\?\)"):
        dispatch("start -n 2 --backend gloo --nccl ALOG=Ring")
    with pytest.raises(UsageError, match="--nccl-preset 'efa' is not one of ib, roce, nvl72"):
        dispatch("start -n 2 --backend gloo --nccl-preset efa")
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before  # nothing started

    r = shell.run_cell(
        "%distrain start -n 2 --backend gloo --threads 1 --session nccl --nccl ALGO=Ring,PROTO=Simple --nccl-preset ib"
    )
    assert r.success, r.error_in_exec
    import workbench

    rs = workbench.session("nccl").rankset
    fresh_ranks.started.append(rs)
    r = shell.run_cell("%%distrain\nimport os\nnccl = {k: v for k, v in os.environ.items() if k.startswith('NCCL_')}")
    assert r.success, r.error_in_exec
    want = {
        "NCCL_ALGO": "Ring",
        "NCCL_PROTO": "Simple",
        "NCCL_IB_DISABLE": "0",
        "NCCL_NET_GDR_LEVEL": "PHB",
        "NCCL_IB_QPS_PER_CONNECTION": "4",
        "NCCL_IB_ADAPTIVE_ROUTING": "1",
    }
    assert all(got.items() >= want.items() for got in rs.pull("nccl")), rs.pull("nccl")
    table = shell.run_line_magic("distrain", "status")
    # this torch has no NCCL (CPU build): status says so, with every NCCL_* in force per rank
    for line in table["nccl"]:
        assert line.startswith(("no NCCL in this torch; ", "NCCL ")), line
        for k, v in want.items():
            assert f"{k}={v}" in line, line
    r = shell.run_cell("%distrain restart")  # a restarted set keeps its settings
    assert r.success, r.error_in_exec
    assert all("NCCL_ALGO=Ring" in line for line in shell.run_line_magic("distrain", "status")["nccl"])
