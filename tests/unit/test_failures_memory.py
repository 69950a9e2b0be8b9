"""Out-of-memory report. The OOM is SIMULATED on CPU: the step raises ``torch.OutOfMemoryError``
(and ``MemoryError``) itself; no memory is actually exhausted."""

from __future__ import annotations

import pytest
import torch

from workbench.engine.memory_report import explain_oom, format_report, memory_breakdown
from workbench.models import GPT, GPTConfig


def trained_tiny():
    torch.manual_seed(0)
    model = GPT(GPTConfig.tiny())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (2, 16))
    model(x).sum().backward()
    opt.step()
    return model, opt


def test_simulated_cuda_oom_names_optimizer_state_and_suggests_sharding():
    model, opt = trained_tiny()
    with pytest.raises(torch.OutOfMemoryError) as err:
        with explain_oom(model, opt, batch=(torch.zeros(2, 16, dtype=torch.long),)):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
    msg = str(err.value)
    assert "Tried to allocate 2.00 GiB (simulated)" in msg  # the original message is kept
    assert "optimizer state dominated" in msg and "FSDP2" in msg and "zero_stage=2" in msg
    rep = err.value.memory_report["bytes"]
    assert rep["parameters"] == rep["gradients"]
    assert 0 <= rep["optimizer state"] - 2 * rep["parameters"] < 1000  # exp_avg, exp_avg_sq (+ step scalars)
    assert isinstance(err.value.__cause__, torch.OutOfMemoryError)


def test_simulated_host_oom_with_large_batch_points_at_activations():
    model, opt = trained_tiny()
    with pytest.raises(MemoryError) as err:
        with explain_oom(model, opt, batch=(torch.zeros(512, 32, dtype=torch.long),)):
            raise MemoryError("simulated")
    msg = str(err.value)
    assert "activations (estimate) dominated" in msg
    assert "activation_checkpointing=full" in msg and "grad_accum" in msg


def test_breakdown_before_first_step_counts_what_adam_will_hold():
    torch.manual_seed(0)
    model = GPT(GPTConfig.tiny())
    info = memory_breakdown(model, torch.optim.Adam(model.parameters()))
    b = info["bytes"]
    assert b["optimizer state"] == 2 * b["parameters"] and b["gradients"] == b["parameters"]
    assert "out of memory on this rank" in format_report(info)


def test_batch_shape_known_only_at_failure_time_feeds_the_activation_estimate():
    model, opt = trained_tiny()
    shape = [None]
    with pytest.raises(MemoryError) as err:
        with explain_oom(model, opt, batch_shape=lambda: shape[0]):  # how the trainer passes it
            shape[0] = (512, 32)
            raise MemoryError("simulated")
    assert "activations (estimate) dominated" in str(err.value)
