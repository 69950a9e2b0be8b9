"""The checkers of labs 08-12 without processes: a right answer passes, and each typical
mistake gets the hint written for it (not a bare "wrong")."""

from __future__ import annotations

import pytest

from workbench.labs import CheckFailed, lab_08, lab_09, lab_11
from workbench.planner.collectives import busbw, fit_alpha_beta


def fails(fn, value, *words, **measured):
    with pytest.raises(CheckFailed) as info:
        fn(value, **measured)
    text = str(info.value)
    for w in words:
        assert w in text, (w, text)
    return text


# ------------------------------------------------------------------ formulas
def test_busbw_factors_follow_nccl_tests():
    assert busbw("all_reduce", 8, 8e9, 1.0) == 8e9 * 2 * 7 / 8
    assert busbw("all_gather", 4, 4e9, 2.0) == 2e9 * 3 / 4
    assert busbw("broadcast", 16, 1e9, 1.0) == 1e9
    with pytest.raises(ValueError, match="known"):
        busbw("allreduce", 2, 1, 1)


def test_alpha_beta_fit_recovers_a_line():
    alpha, bw = 50e-6, 2e9
    sizes = [2**k for k in range(10, 22, 2)]
    fit = fit_alpha_beta(sizes, [alpha + s / bw for s in sizes])
    assert fit.alpha == pytest.approx(alpha, rel=1e-6) and fit.bandwidth == pytest.approx(bw, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)
    with pytest.raises(ValueError, match="noise"):
        fit_alpha_beta([1e3, 1e6], [1e-3, 1e-4])


# ------------------------------------------------------------------ lab 08
POINT = dict(collective="all_reduce", ranks=4, nbytes=1e6, seconds=1e-3)  # algbw 1e9


def test_busbw_hints():
    assert "busbw 1.500 GB/s = algbw x 1.5" in lab_08.check_busbw(1e9 * 1.5, **POINT)
    fails(lab_08.check_busbw, 1e9, "algorithm bandwidth", **POINT)
    fails(lab_08.check_busbw, 1e9 * 0.75, "(n-1)/n", "2(n-1)/n", **POINT)
    fails(lab_08.check_busbw, 2e9, "limit of 2(n-1)/n", **POINT)
    fails(lab_08.check_busbw, 1.5e9 * 4, "factor of the world size", **POINT)
    fails(lab_08.check_busbw, 1.5e9 / 1e9, "10^9", **POINT)
    fails(lab_08.check_busbw, ..., "replace the `...`", **POINT)


def test_alpha_beta_hints():
    m = dict(alpha=1e-4, bandwidth=1e9, nbytes=4e6)  # 0.0041 s
    lab_08.check_alpha_beta(1e-4 + 4e-3, **m)
    fails(lab_08.check_alpha_beta, 4e-3, "left out alpha", **m)
    fails(lab_08.check_alpha_beta, 1e-4, "alpha alone", **m)
    fails(lab_08.check_alpha_beta, 1e-4 + 4e6 * 1e9, "multiplied by the bandwidth", **m)
    fails(lab_08.check_alpha_beta, (1e-4 + 4e-3) * 1e3, "10^3", **m)


def test_ring_hints():
    inputs = [[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]]
    ref = [[11.0, 22.0, 33.0, 44.0]] * 2
    lab_08.check_ring([list(r) for r in ref], reference=ref, inputs=inputs)
    fails(lab_08.check_ring, inputs, "nothing was added", reference=ref, inputs=inputs)
    fails(lab_08.check_ring, [[x / 2 for x in r] for r in ref], "mean", reference=ref, inputs=inputs)
    # after the reduce-scatter alone: rank 0 owns chunk 1, rank 1 owns chunk 0
    rs_only = [[1.0, 2.0, 33.0, 44.0], [11.0, 22.0, 30.0, 40.0]]
    fails(lab_08.check_ring, rs_only, "all-gather phase", "[1, 0]", reference=ref, inputs=inputs)
    fails(lab_08.check_ring, [r[:2] for r in ref], "whole buffer", reference=ref, inputs=inputs)


def test_ring_bytes_hints():
    lab_08.check_ring_bytes(6000, sent=6000, ranks=4, nbytes=4000)
    fails(lab_08.check_ring_bytes, 4000, "2(n-1)/n", sent=6000, ranks=4, nbytes=4000)
    fails(lab_08.check_ring_bytes, 8000, "limit", sent=6000, ranks=4, nbytes=4000)
    fails(lab_08.check_ring_bytes, 3000, "one phase", sent=6000, ranks=4, nbytes=4000)
    fails(lab_08.check_ring_bytes, 8000, "sends too much", sent=8000, ranks=4, nbytes=4000)


# ------------------------------------------------------------------ lab 09
def test_attention_bytes_hints():
    seqs, b, h, d = [128, 256], 1, 2, 16
    measured = [4 * b * h * (3 * s * d + s * s) for s in seqs]
    m = dict(measured=measured, seqs=seqs, batch=b, heads=h, head_dim=d)
    lab_09.check_attention_bytes(list(measured), **m)
    fails(lab_09.check_attention_bytes, [x / 4 for x in measured], "4 bytes per element", **m)
    fails(lab_09.check_attention_bytes, [4 * b * h * 3 * s * d for s in seqs], "linearly", **m)
    fails(lab_09.check_attention_bytes, [4 * b * h * s * s for s in seqs], "but not q, k and v", **m)
    fails(lab_09.check_attention_bytes, [x / h for x in measured], "number of heads", **m)
    fails(lab_09.check_attention_bytes, ..., "replace the `...`", **m)


def test_sp_bytes_hints():
    m = dict(buffer_bytes=8000, ranks=4, tp_wire=12000.0)
    lab_09.check_sp_bytes(12000.0, **m)
    fails(lab_09.check_sp_bytes, 6000.0, "one of the two collectives", **m)
    fails(lab_09.check_sp_bytes, 3000.0, "world size", **m)
    fails(lab_09.check_sp_bytes, 16000.0, "many-rank limit", **m)


def test_ring_attention_hints():
    ref = [[[1.0, 2.0], [3.0, -4.0]], [[0.5, 0.25], [2.0, 1.0]]]
    local = [[[9.0, 9.0], [9.0, 9.0]], [[8.0, 8.0], [8.0, 8.0]]]
    m = dict(reference=ref, local_only=local)
    lab_09.check_ring_attention([[list(r) for r in rk] for rk in ref], **m)
    fails(lab_09.check_ring_attention, local, "never came round the ring", **m)
    scaled = [[[x * f for x in row] for row, f in zip(rk, (1.7, 0.4))] for rk in ref]
    fails(lab_09.check_ring_attention, scaled, "normalisation", **m)
    noisy = [[[x + (0.1 if i == 0 else -0.3) for i, x in enumerate(row)] for row in rk] for rk in ref]
    fails(lab_09.check_ring_attention, noisy, "exp(m_old - m_new)", **m)


# ------------------------------------------------------------------ lab 11
WAITING = (
    "Thread 0x1 (most recent call first):\n"
    '  File "/x/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n'
    '  File "/x/torch/distributed/c10d_logger.py", line 83 in wrapper\n'
    '  File "/tmp/ipykernel_1/1.py", line 8 in train_step\n'
)
LOADING = (
    "Thread 0x2 (most recent call first):\n"
    '  File "/tmp/ipykernel_2/1.py", line 3 in load_batch\n'
    '  File "/tmp/ipykernel_2/1.py", line 7 in train_step\n'
)


def test_hang_hints():
    stacks = {0: WAITING, 1: LOADING, 2: WAITING}
    assert lab_11.blocked_in(WAITING) == "all_reduce" and lab_11.blocked_in(LOADING) is None
    assert lab_11.check_culprit(1, stacks=stacks) == "rank 1 never reached the collective that rank(s) [0, 2] waited in"
    fails(lab_11.check_culprit, 0, "victim", stacks=stacks)
    fails(lab_11.check_culprit, 5, "no rank 5", stacks=stacks)
    fails(lab_11.check_culprit, "1", "one rank number", stacks=stacks)
    fails(lab_11.check_culprit, 1, "run the drill cell again", stacks={0: WAITING, 1: WAITING})
    lab_11.check_blocked_in("all_reduce", stacks=stacks)
    fails(lab_11.check_blocked_in, "broadcast", "in all_reduce, not 'broadcast'", stacks=stacks)


def test_nan_rank_hints():
    before, after = [[], ["0.weight"]], [["0.weight", "0.bias"]] * 2
    lab_11.check_nan_rank(1, before=before, after=after)
    fails(lab_11.check_nan_rank, 0, "BEFORE the all-reduce", before=before, after=after)
    fails(lab_11.check_nan_rank, 0, "rank(s) [1]", before=before, after=[[], []])
    lab_11.check_local_bad([[], ["0.weight"]], truth=before)
    fails(lab_11.check_local_bad, [[], []], "your test found [] on rank 1", truth=before)
    fails(lab_11.check_local_bad, [..., ...], "still `...`", truth=before)


def test_rollback_hints():
    cps = [
        {"name": "step-2", "step": 2, "problems": []},
        {"name": "step-4", "step": 4, "problems": []},
        {"name": "step-6", "step": 6, "problems": ["__1_0.distcp: truncated"]},
        {"name": "step-8", "step": 8, "problems": []},
    ]
    assert "step-4 (step 4) is the newest" in lab_11.check_rollback(4, checkpoints=cps, nan_step=7)
    fails(lab_11.check_rollback, 6, "damaged", "truncated", checkpoints=cps, nan_step=7)
    fails(lab_11.check_rollback, 8, "after the NaN", checkpoints=cps, nan_step=7)
    fails(lab_11.check_rollback, 2, "older than needed", "2 fewer steps", checkpoints=cps, nan_step=7)
    fails(lab_11.check_rollback, 3, "no checkpoint at step 3", checkpoints=cps, nan_step=7)


# ------------------------------------------------------------------ lab 10
def test_group_hints():
    from workbench.labs import lab_10

    groups = {"pp": [0, 2], "dp_shard": [0, 1]}
    lab_10.check_group([1, 0], groups=groups, dim="dp_shard", world=4)
    fails(lab_10.check_group, [0, 2], "pipeline group", groups=groups, dim="dp_shard", world=4)
    fails(lab_10.check_group, [0, 1, 2, 3], "whole world", groups=groups, dim="dp_shard", world=4)
    fails(lab_10.check_group, [1, 3], "rank 0 is in its own group", groups=groups, dim="dp_shard", world=4)
    fails(lab_10.check_group, ..., "list of rank numbers", groups=groups, dim="dp_shard", world=4)


def test_param_bytes_hints():
    from workbench.labs import lab_10

    m = dict(measured=34944, stage_bytes=69888, pp=2, dp_shard=2)
    lab_10.check_param_bytes(34944, **m)
    fails(lab_10.check_param_bytes, 69888, "whole stage", **m)
    fails(lab_10.check_param_bytes, 17472, "dp_shard (2) only", **m)
    fails(lab_10.check_param_bytes, 8736, "4 bytes", **m)


def test_slow_link_bytes_hints():
    from workbench.labs import lab_12

    m = dict(measured=638_828.0, param_bytes=297_988)  # lab 12's run: 7.2% of headers on the wire
    assert "595,976 bytes per step predicted, 638,828 measured" in lab_12.check_ddp_link_bytes(595_976, **m)
    fails(lab_12.check_ddp_link_bytes, 297_988, "that is one direction", **m)
    fails(lab_12.check_ddp_link_bytes, 2 * 74_497, "parameters, not bytes", **m)
    fails(lab_12.check_ddp_link_bytes, 4 * 297_988, "2(n-1)/n x B = B bytes per rank, not 2B", **m)
    fails(lab_12.check_ddp_link_bytes, "600k", "should be a number", **m)


def test_slow_link_step_time_hints():
    from workbench.labs import lab_12

    m = dict(measured_ms=166.4, param_bytes=297_988, mbit=16.0)  # the bound: 149 ms
    assert lab_12.check_ddp_step_ms(148.994, **m).startswith("149 ms: 297,988 bytes each way at 16 Mbit/s")
    assert "the link busy for 90% of it" in lab_12.check_ddp_step_ms(149, **m)
    fails(lab_12.check_ddp_step_ms, 149 / 8, "bytes are not bits", **m)
    fails(lab_12.check_ddp_step_ms, 149 * 2, "full duplex", **m)
    fails(lab_12.check_ddp_step_ms, 0.149, "in milliseconds", **m)
    fails(lab_12.check_ddp_step_ms, 149 * 1.048576, "10^6 bits, not 2^20", **m)
    fails(lab_12.check_ddp_step_ms, 149, "faster than the 149 ms the link allows", **{**m, "measured_ms": 60.0})


def test_slow_link_ratio_hints():
    from workbench.labs import lab_12

    m = dict(ddp_bytes=638_828.0, diloco_bytes=64_458.0, sync_every=10)
    assert "DiLoCo sent 9.9x fewer bytes per step than DDP (H = 10)" in lab_12.check_sync_ratio(10, **m)
    fails(lab_12.check_sync_ratio, 0.1, "DiLoCo's share of DDP's bytes (1/H)", **m)
    fails(lab_12.check_sync_ratio, 20, "one pseudo-gradient per parameter", **m)
    fails(lab_12.check_sync_ratio, 100, "off by about 10^1", **m)
