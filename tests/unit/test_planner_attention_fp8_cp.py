"""Attention kernels, FLOPs conventions, fp8, context parallelism and the wider
recommend() search, against numbers worked by hand."""

from __future__ import annotations

import pytest

from workbench.planner import (
    ModelSpec,
    PlanLayout,
    activation_bytes_per_layer,
    communication_per_step,
    load_hardware,
    memory_per_rank,
    plan,
    plan_from_args,
    recommend,
)
from workbench.planner.communication import CommBreakdown, CommItem
from workbench.planner.flops import token_flops
from workbench.planner.recommend import candidate_layouts

H100 = load_hardware("h100")
# layers 8, h 8, a 2, kv 2, ffn 32, vocab 16, s 4: per layer matmul params 256 + 768 = 1024,
# head 16 x 8 = 128 -> N_matmul = 8 * 1024 + 128 = 8320; L h s = 8 * 8 * 4 = 256
TINY = ModelSpec(layers=8, hidden=8, heads=2, kv_heads=2, ffn=32, vocab=16, seq_len=4)
# the same shape as Korthikanti et al.'s GPT block (4h GELU MLP, dropout): their 34 sbh
TINY_GPT = ModelSpec(
    layers=8, hidden=8, heads=2, kv_heads=2, ffn=32, vocab=16, seq_len=4, gated_mlp=False, dropout=True
)
LLAMA70 = ModelSpec.llama("70b")


def test_flash_drops_the_score_term_eager_keeps_it():
    # s=4, b=2, h=8, a=2: sbh = 64; 34 sbh = 2176; 5 a s^2 b = 320
    assert activation_bytes_per_layer(TINY_GPT, PlanLayout(micro_batch_size=2)) == 2176
    assert activation_bytes_per_layer(TINY_GPT, PlanLayout(micro_batch_size=2, attention="eager")) == 2176 + 320
    assert PlanLayout().attention == "flash"
    # Llama 3 405B (kv 8 of 128 heads, ffn 53248 = 3.25 h, no dropout), per s b h:
    # norms 4 + attention input 2 + Q 2 + K, V 4 * 8/128 + output 2 + MLP input 2
    # + gate, up 4 * 3.25 + down input 2 * 3.25 = 31.75; eager adds the softmax output
    # 2 a s / h = 2 * 128 * 8192 / 16384 = 128 (no dropout mask or output)
    llama405 = ModelSpec.llama("405b")
    flash = activation_bytes_per_layer(llama405, PlanLayout(tp=8))
    eager = activation_bytes_per_layer(llama405, PlanLayout(tp=8, attention="eager"))
    assert flash == 31.75 * 8192 * 16384 / 8
    assert eager / flash == pytest.approx((31.75 + 128) / 31.75)
    with pytest.raises(ValueError, match="attention='sdpa' is not one of flash, eager"):
        PlanLayout(attention="sdpa")


def test_flops_per_token_by_hand():
    f = token_flops(TINY, PlanLayout())
    assert f.matmul == 6 * 8320
    assert f.attention == 7 * 256  # flash: causal forward 2 Lhs + backward 2.5x = 5 Lhs
    assert f.model == 6 * 8320 + 6 * 256  # causal useful work: 2 Lhs forward + 4 backward
    # published (PaLM appendix B): 6 N (N = 8584 with both embeddings) + 12 L h s
    assert TINY.params().total == 8584
    assert f.published == 6 * 8584 + 12 * 256
    assert f.published_hardware == f.published
    eager = token_flops(TINY, PlanLayout(attention="eager"))
    assert eager.attention == 12 * 256  # the masked half is computed too
    # full recompute: the layers' forward again (not the head): 2 * 8 * 1024, + 2 Lhs flash
    full = token_flops(TINY, PlanLayout(recompute="full"))
    assert full.matmul == 6 * 8320 + 2 * 8 * 1024 and full.attention == 7 * 256 + 2 * 256
    assert full.published_hardware == f.published + 2 * 8584 + 4 * 256  # 8N + 16 Lhs
    # selective recompute costs nothing more under flash; eager reruns the scores (4 Lhs)
    assert token_flops(TINY, PlanLayout(recompute="selective")).attention == 7 * 256
    assert token_flops(TINY, PlanLayout(recompute="selective", attention="eager")).attention == 16 * 256


def test_mfu_conventions_side_by_side():
    p = plan(LLAMA70, PlanLayout(tp=8, pp=8, dp_shard=4, zero_stage=1, microbatches=64), H100)
    c = p.compute
    world = 256
    assert c.mfu == pytest.approx(c.model_flops_per_step / (c.step_seconds * world * 989e12))
    assert c.mfu_published == pytest.approx(c.published_flops_per_step / (c.step_seconds * world * 989e12))
    # causal halving and the embedding lookup: the planner's count is the smaller one
    assert c.mfu < c.mfu_published
    text = p.summary()
    assert "published convention" in text and "PaLM appendix B" in text


def test_fp8_matmuls_at_the_fp8_peak_attention_at_bf16():
    p = plan(TINY, PlanLayout(precision="fp8"), H100)
    c = p.compute
    tokens = 4
    assert c.matmul_seconds == pytest.approx(6 * 8320 * tokens / (1979e12 * 0.55))
    assert c.attention_seconds == pytest.approx(7 * 256 * tokens / (989e12 * 0.55))
    bf16 = plan(TINY, PlanLayout(), H100).compute
    assert bf16.matmul_seconds == pytest.approx(2 * c.matmul_seconds)
    assert bf16.attention_seconds == pytest.approx(c.attention_seconds)


def test_fp8_memory_as_transformer_engine_keeps_it():
    # saved linear inputs (14 of the 34 sbh) in one byte: 27 sbh
    assert activation_bytes_per_layer(TINY_GPT, PlanLayout(micro_batch_size=2, precision="fp8")) == 27 * 64
    # gated TINY (40 sbh): attention input, output, MLP input 2 each and down input 8 halved
    assert activation_bytes_per_layer(TINY, PlanLayout(micro_batch_size=2, precision="fp8")) == (40 - 7) * 64
    m = memory_per_rank(TINY, PlanLayout(precision="fp8"))
    assert m.fp8_weights == 2 * 1024 * 8  # fp8 weight + transpose of each layer matmul
    assert m.parameters == 2 * TINY.params().total  # bf16 weights stay
    assert m.total == pytest.approx(16 * TINY.params().total + m.activations + m.logits + m.fp8_weights)
    assert memory_per_rank(TINY, PlanLayout(precision="fp8", dp_shard=2, zero_stage=3)).fp8_weights == 0
    # ZeRO-3 gathers fp8 parameters: half the bf16 bytes
    z3 = {i.collective: i.bytes for i in communication_per_step(TINY, PlanLayout(dp_shard=4, zero_stage=3), H100).items}
    z3_fp8 = {
        i.collective: i.bytes
        for i in communication_per_step(TINY, PlanLayout(dp_shard=4, zero_stage=3, precision="fp8"), H100).items
    }
    assert z3_fp8["all_gather"] == pytest.approx(z3["all_gather"] / 2)
    assert z3_fp8["reduce_scatter"] == pytest.approx(z3["reduce_scatter"])


def test_context_parallel_ring_bytes_and_overlap():
    # K and V per hop: 2 * s/cp (2) * b (1) * kv_heads (2) * head_dim (4) * 2 bytes = 64;
    # (cp-1) hops, 3 sends per hop (K/V forward; K/V and their grads backward), 8 layers
    comm = communication_per_step(TINY, PlanLayout(cp=2), H100)
    ring = [i for i in comm.items if i.group == "cp"]
    assert len(ring) == 1 and ring[0].bytes == 64 * 3 * 8 and ring[0].overlappable
    # grouped-query attention with tp > kv_heads: the one kv head is replicated, not split
    gqa = ModelSpec(layers=2, hidden=8, heads=2, kv_heads=1, ffn=32, vocab=16, seq_len=4)
    ring_gqa = [i for i in communication_per_step(gqa, PlanLayout(cp=2, tp=2), H100).items if i.group == "cp"][0]
    assert ring_gqa.bytes == 2 * 2 * 1 * 1 * 4 * 2 * 3 * 2
    # the ring hides only behind attention; data-parallel syncs behind all compute
    items = (
        CommItem("send_recv", "cp", 2, 1.0, True, 0.5, True, "ring"),
        CommItem("all_reduce", "dp", 2, 1.0, False, 1.0, True, "dp"),
        CommItem("all_gather", "tp", 2, 1.0, True, 0.2, False, "tp"),
    )
    assert CommBreakdown(items).exposed_seconds(2.0, attention_seconds=0.3) == pytest.approx(0.2 + (0.5 - 0.3) + 0.0)
    # activations on s / cp
    assert activation_bytes_per_layer(TINY_GPT, PlanLayout(cp=2, micro_batch_size=2)) == 2176 / 2


def test_recommend_searches_cp_for_long_sequences():
    long = ModelSpec.llama("70b", seq_len=131072)
    recs = recommend(long, 256, "h100", top=3)
    assert all(r.layout.cp > 1 and "ring attention" in r.reason for r in recs)
    assert all(r.plan.fits for r in recs)
    no_cp = candidate_layouts(long, 256, H100, global_batch=32, cps=[1])
    assert {c.cp for c in no_cp} == {1}
    # short sequences: CP is not searched unless asked for
    assert {c.cp for c in candidate_layouts(LLAMA70, 64, H100, global_batch=64)} == {1}


def test_recommend_searches_ep_and_fp8():
    mixtral = ModelSpec.preset("mixtral-8x7b")
    layouts = candidate_layouts(mixtral, 64, H100, global_batch=1024)
    assert {c.ep for c in layouts} == {1, 2, 4, 8}
    bf16 = recommend(mixtral, 64, "h100", top=5)
    fp8 = recommend(mixtral, 64, "h100", top=5, precision="fp8")
    assert all(r.layout.precision == "fp8" for r in fp8)
    assert fp8[0].plan.compute.step_seconds < bf16[0].plan.compute.step_seconds
    assert any(r.layout.ep > 1 and "EP=" in r.reason for r in bf16 + fp8)


def test_recommend_searches_optimizer_offload_when_asked():
    with pytest.raises(ValueError, match="or offload=True"):
        recommend(LLAMA70, 8, "h100")
    recs = recommend(LLAMA70, 8, "h100", top=2, offload=True)
    for r in recs:
        assert r.layout.optimizer_offload and r.plan.fits
        assert "optimizer offloaded to CPU" in r.reason
        # host copies (grads down, params up, 2 + 2 bytes) and CPU Adam at 1e9 params/s
        params = r.plan.memory.cpu_offload / 12
        assert r.plan.compute.offload_seconds == pytest.approx(params * 4 / 55e9 + params / 1e9)


@pytest.mark.parametrize("flag", ["--fp8", "--attention eager", "--cp 2", "--offload", "--precision fp8"])
def test_each_new_flag_changes_the_plan(flag):
    base = "--model 70b --hw h100 --tp 8 --pp 4 --dp 8 --zero 1 -m 32"
    plain, flagged = plan_from_args(base), plan_from_args(f"{base} {flag}")
    assert (flagged.memory.total, flagged.compute.step_seconds, flagged.comm.total_bytes) != (
        plain.memory.total,
        plain.compute.step_seconds,
        plain.comm.total_bytes,
    )


def test_conflicting_precision_flags_are_refused():
    with pytest.raises(ValueError, match="--fp8 and --precision bf16 disagree"):
        plan_from_args("--model 70b --hw h100 --fp8 --precision bf16")
    with pytest.raises(ValueError, match="invalid choice: 'sdpa'"):
        plan_from_args("--model 70b --hw h100 --attention sdpa")
