"""What the trainer's telemetry reports on a GPU is what CUDA measures (``-m gpu``; skipped
without CUDA, so never run on the CPU machines; written on a machine without a GPU).

One spawned world-size-1 NCCL rank (``one_gpu``) trains a ~40M-parameter GPT in bf16 with the
workbench trainer and times all-reduces, and the tests compare:

- memory: the step's ``memory_max_allocated_bytes`` / ``memory_allocated_bytes`` with
  ``torch.cuda.max_memory_allocated`` / ``memory_allocated`` read right after the run:
  within 1 MiB (both read the caching allocator's counters; nothing is allocated between
  the last step's read and the test's);
- MFU: in (0, 1], equal (1e-9 relative) to the step's tokens/s x the planner's FLOPs per
  token / the catalogue's peak for this GPU, and the trainer's summed step times within
  15% of the run's wall time measured outside it (what lies between steps: the thread's
  flag checks and the event hand-off, well under a millisecond against ~10 ms steps);
- collectives: an all_reduce through the installed wrappers records its time from CUDA
  events; the recorded time is > 0 and within 20 us + 5% of a CUDA-event pair recorded
  around the same call; and an all_reduce that spends ~10 ms on the device behind a
  host-side launch of well under that is recorded as the device time, not the launch time,
  also with ``async_op=True`` (its end event recorded from the work's future).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MIB = 2**20
WARM, STEPS, BATCH, SEQ = 3, 20, 8, 512


def _run():
    import time

    import torch.distributed as dist

    from workbench.engine import comm_timing, telemetry
    from workbench.engine.trainer import Trainer
    from workbench.models import GPT, GPTConfig
    from workbench.planner.flops import training_flops_per_token

    out = {"gpu": torch.cuda.get_device_name(0)}
    # ---- the trainer's memory and MFU
    cfg = GPTConfig.m100(n_layers=4, max_seq_len=SEQ)
    torch.manual_seed(0)
    model = GPT(cfg).to("cuda", torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    g = torch.Generator().manual_seed(0)
    pool = []
    for _ in range(4):
        tok = torch.randint(0, cfg.vocab, (BATCH, SEQ + 1), generator=g)
        pool.append((tok[:, :-1].cuda(), tok[:, 1:].cuda()))
    torch.cuda.reset_peak_memory_stats()
    tr = Trainer(model=model, optimizer=opt, data=lambda i: pool[i % len(pool)], memory_interval_s=3600)
    records = []
    tr.add_hook(records.append, pauses=False)
    tr.start(WARM)
    assert tr.wait(120)["state"] == "finished"
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    tr.start(STEPS)
    status = tr.wait(120)
    torch.cuda.synchronize()
    out["wall_s"] = time.perf_counter() - t0
    out["state"] = status["state"]
    out["max_allocated"] = torch.cuda.max_memory_allocated()
    out["allocated"] = torch.cuda.memory_allocated()
    out["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    out["records"] = [{k: r.get(k) for k in ("tps", "mfu", "time_step_s", "step")} for r in records[WARM:]]
    out["last"] = dict(tr.last)
    out["tokens_per_step"] = BATCH * SEQ
    out["flops_per_token"] = training_flops_per_token(cfg.num_params(), cfg.n_layers, cfg.dim, cfg.max_seq_len)
    out["peak"] = telemetry.device_peak_flops("cuda", "bf16")

    # ---- an all_reduce through the installed wrappers, against events around the call
    comm_timing.install()
    x = torch.ones(2**26, device="cuda")
    for _ in range(3):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    stats = comm_timing.STATS
    stats.resolve()
    n0 = stats.span_count
    pairs = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dist.all_reduce(x)
        b.record()
        pairs.append((a, b))
    torch.cuda.synchronize()
    out["reference_s"] = [a.elapsed_time(b) / 1e3 for a, b in pairs]
    out["recorded_s"] = [e - s for kind, s, e, _ in stats.spans_since(n0) if kind == "all_reduce"]

    # ---- an all_reduce whose device time the host never waits for
    original = comm_timing.original("all_reduce")

    def slow_all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        torch.cuda._sleep(20_000_000)  # ~10 ms of GPU cycles, queued ahead of the collective
        return original(tensor, op=op, group=group, async_op=async_op)

    timed = comm_timing._wrap("all_reduce", slow_all_reduce)
    n0 = stats.span_count
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    h0 = time.perf_counter()
    timed(x)
    out["slow_host_s"] = time.perf_counter() - h0
    b.record()
    torch.cuda.synchronize()
    out["slow_reference_s"] = a.elapsed_time(b) / 1e3
    out["slow_recorded_s"] = [e - s for kind, s, e, _ in stats.spans_since(n0) if kind == "all_reduce"]
    # the same with async_op=True: the end event is recorded from the work's future
    n0 = stats.span_count
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    timed(x, async_op=True).wait()
    b.record()
    torch.cuda.synchronize()
    out["async_reference_s"] = a.elapsed_time(b) / 1e3
    out["async_recorded"] = [(e - s, w) for kind, s, e, w in stats.spans_since(n0) if kind == "all_reduce"]
    comm_timing.uninstall()
    return out


@pytest.fixture(scope="module")
def measured():
    from one_gpu import on_one_gpu

    return on_one_gpu(_run)


def test_memory_metrics_are_torch_cuda_figures(measured):
    m, last = measured, measured["last"]
    assert m["state"] == "finished"
    assert m["max_allocated"] > 3 * m["param_bytes"]  # weights + grads + AdamW state at least
    assert abs(last["memory_max_allocated_bytes"] - m["max_allocated"]) <= MIB
    assert abs(last["memory_allocated_bytes"] - m["allocated"]) <= MIB
    # active blocks include allocated ones (and those waiting on another stream)
    assert last["memory_max_active_bytes"] >= last["memory_max_allocated_bytes"]
    assert last["memory_max_reserved_bytes"] >= last["memory_max_active_bytes"]


def test_mfu_is_a_fraction_consistent_with_tokens_per_second(measured):
    m = measured
    if m["peak"] is None:
        pytest.skip(f"{m['gpu']} is not in the planner's hardware catalogue: no peak, no MFU")
    if "H200" in m["gpu"]:
        from workbench.planner.hardware import HARDWARE

        assert m["peak"] == HARDWARE["h200"].peak_flops("bf16")
    recs = m["records"]
    assert len(recs) == STEPS
    for r in recs:
        assert 0 < r["mfu"] <= 1
        assert r["tps"] == pytest.approx(m["tokens_per_step"] / r["time_step_s"], rel=1e-9)
        assert r["mfu"] == pytest.approx(r["tps"] * m["flops_per_token"] / m["peak"], rel=1e-9)
    stepped = sum(r["time_step_s"] for r in recs)
    assert 0.85 * m["wall_s"] <= stepped <= m["wall_s"]
    outside_tps = STEPS * m["tokens_per_step"] / m["wall_s"]
    mfu_outside = outside_tps * m["flops_per_token"] / m["peak"]
    median_mfu = sorted(r["mfu"] for r in recs)[STEPS // 2]
    assert median_mfu == pytest.approx(mfu_outside, rel=0.2)


def test_all_reduce_time_is_device_time(measured):
    m = measured
    rec, ref = m["recorded_s"], m["reference_s"]
    assert len(rec) == len(ref) == 10
    for got, want in zip(rec, ref):
        assert 0 < got <= want + 20e-6
        assert abs(got - want) <= 20e-6 + 0.05 * want
    # the device spent ~10 ms; the host call returned after the launch
    (slow,) = m["slow_recorded_s"]
    assert m["slow_reference_s"] > 2e-3
    assert slow == pytest.approx(m["slow_reference_s"], rel=0.05, abs=20e-6)
    assert m["slow_host_s"] < 0.5 * slow, "the host clock would have seen the whole collective"


def test_async_all_reduce_time_is_device_time(measured):
    m = measured
    ((got, blocking),) = m["async_recorded"]
    assert not blocking and m["async_reference_s"] > 2e-3
    assert got == pytest.approx(m["async_reference_s"], rel=0.05, abs=20e-6)
