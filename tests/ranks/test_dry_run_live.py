"""A dry run against the same layouts on 8 live CPU ranks (gloo), one rank set for all.

A transformers Llama of 4 layers (256 hidden, 4.2M parameters, fp32) is laid out by FSDP2
over 8 ranks, by FSDP2 x TP 2 and by a 2-stage pipeline of FSDP2 over 4; each live rank
steps once (so that the optimizer's state exists), then steps again under
``engine.step_peak.measure_step``: the census's bytes and the step's peak from the CPU
allocator's own accounting (``torch.profiler``'s memory events). The dry run of the same
config, layout and batch must hold exactly the parameter, gradient and optimizer bytes
each live rank holds, and peak within 10% of each rank's measured peak.
"""

from __future__ import annotations

import pytest

CFG = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    vocab_size=512,
    tie_word_embeddings=False,
    max_position_embeddings=128,
)
SEQ, BATCH = 128, 4
LAYOUTS = {
    "fsdp2": dict(dp_shard=8),
    "fsdp2 x tp": dict(dp_shard=4, tp=2),
    "pp 2 x fsdp2": dict(dp_shard=4, pp=2, microbatches=2),
}
PEAK = 0.10


def step_on_rank(spec: str, cfg: dict, batch: int, seq: int) -> dict:
    """On a live rank: build, prepare, one step, then the measured step."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from workbench import engine
    from workbench.engine import session
    from workbench.engine.step_peak import measure_step

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**cfg), attn_implementation="sdpa")
    prepared = engine.prepare(model, lambda ps: torch.optim.AdamW(ps, lr=1e-4), spec)
    try:
        g = torch.Generator().manual_seed(engine.rank)
        data = tuple(torch.randint(0, cfg["vocab_size"], (batch, seq), generator=g) for _ in range(2))
        prepared.train_step(data)
        return measure_step(data, prepared)
    finally:
        prepared.close()
        session.clear()


@pytest.fixture(scope="module")
def ranks8():
    from conftest import _session_ranks

    gen = _session_ranks(8)
    yield next(gen)
    next(gen, None)


@pytest.fixture(scope="module")
def compared(ranks8):
    from transformers import LlamaConfig

    from workbench.notebook.dry_run import dry_run, spec_text

    out = {}
    for name, degrees in LAYOUTS.items():
        spec = spec_text("fsdp2", gpus=8, precision="fp32", **degrees)
        live = ranks8.apply(step_on_rank, spec, CFG, BATCH, SEQ, timeout=600)
        report = dry_run(LlamaConfig(**CFG), gpus=8, seq=SEQ, batch=BATCH, precision="fp32", **degrees)
        out[name] = (report, report.against(live))
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_dry_run_holds_exactly_the_live_ranks_parameters_gradients_and_optimizer_state(compared, layout):
    report, table = compared[layout]
    assert list(table["rank"]) == list(range(8))
    for key in ("param_bytes", "grad_bytes", "optim_bytes"):
        assert (table[f"dry_{key}"] == table[f"live_{key}"]).all(), table


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_dry_run_peak_is_within_ten_percent_of_each_live_ranks_measured_peak(compared, layout):
    report, table = compared[layout]
    assert ((table["peak_ratio"] - 1).abs() <= PEAK).all(), table[
        ["rank", "dry_peak_bytes", "live_peak_bytes", "peak_ratio"]
    ]
    if layout.startswith("pp"):
        assert sorted(set(table["position"])) == [0, 1]  # one position per stage, the 4 ranks of each grouped
