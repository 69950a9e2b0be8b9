"""A Hugging Face ``Trainer`` (and so trl's trainers) on the dashboard: a thin callback onto
:func:`workbench.engine.reporting.report`, not a telemetry system of its own.

``Trainer(..., callbacks=[engine.hf_callback()])`` on every rank; what each step record holds
is tabled in docs/other-trainers.md."""

from __future__ import annotations

import time

from transformers import TrainerCallback

from . import comm_timing, publisher, runtime
from .reporting import report

SOURCE = "hf"
_LAST_RUN_MS = [0]
_RENAMED = {"learning_rate": "lr", "num_input_tokens_seen": "tokens_seen"}
_RESERVED = {"step", "run", "batch", "source"}
_SUMMARY = "train_loss"  # only in the Trainer's end-of-training log (train_runtime is also in step logs
# when include_num_input_tokens_seen is on)


def agreed_run_id() -> str:
    """Rank 0's clock in ms (one more than the last here, for runs started within a ms),
    broadcast over the default group when there is one."""
    import torch
    import torch.distributed as dist

    ms = _LAST_RUN_MS[0] = max(int(time.time() * 1000), _LAST_RUN_MS[0] + 1)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        device = runtime.context().device if dist.get_backend() == "nccl" else "cpu"
        t = torch.tensor([ms], dtype=torch.int64, device=device)
        comm_timing.original("broadcast")(t, src=0)  # the workbench's traffic, not the user's
        ms = int(t.item())  # rank 0's: every rank names the run alike
        _LAST_RUN_MS[0] = max(_LAST_RUN_MS[0], ms)
    return time.strftime("hf-%Y%m%d-%H%M%S", time.localtime(ms / 1000)) + f"-{ms % 1000:03d}"


class WorkbenchCallback(TrainerCallback):
    """One step record of this rank per optimizer step (``source="hf"``, at
    ``state.global_step``), carrying the Trainer's log of that step where it logs and this
    rank's own token count (a forward pre-hook, accumulation included); one per ``Trainer``."""

    def __init__(self, run: str | None = None):
        self.fixed_run = run
        self.run: str | None = run
        self._hook = None
        self._tokens = 0
        self._samples = 0
        self._pending: tuple[int, dict] | None = None  # a step waiting for the Trainer's log of it

    # --------------------------------------------------------------- counting
    def _count(self, module, args, kwargs) -> None:
        if not module.training:
            return
        name = getattr(module, "main_input_name", "input_ids")
        x = kwargs.get(name, args[0] if args else None)
        if hasattr(x, "numel"):
            self._tokens += x.numel()
            self._samples += x.shape[0] if x.dim() else 1

    def _take_counts(self) -> dict:
        out = {"tokens": self._tokens, "samples": self._samples} if self._hook is not None else {}
        self._tokens = self._samples = 0
        return out

    # --------------------------------------------------------------- events
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.run = self.fixed_run or agreed_run_id()
        self._pending = None
        self._take_counts()
        if model is not None and self._hook is None:
            self._hook = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def on_step_end(self, args, state, control, **kwargs):
        numbers = self._take_counts()
        if state.epoch is not None:
            numbers["epoch"] = float(state.epoch)
        if control.should_log:  # the Trainer logs this step next: one record with its loss
            self._pending = (state.global_step, numbers)
        else:
            self._send(state.global_step, numbers)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if _SUMMARY in logs:
            return
        numbers = {
            _RENAMED.get(k, k): float(v)
            for k, v in logs.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if self._pending is not None and self._pending[0] == state.global_step:
            numbers = {**self._pending[1], **numbers}
            self._pending = None
        self._send(state.global_step, numbers)

    def on_train_end(self, args, state, control, **kwargs):
        if self._pending is not None:
            self._send(*self._pending)
            self._pending = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        publisher.flush()  # the run's last steps reach the notebook before the cell returns

    def _send(self, step: int, numbers: dict) -> None:
        loss = numbers.pop("loss", None)
        # a value logged under one of report()'s own argument names keeps it, prefixed
        numbers = {(f"hf_{k}" if k in _RESERVED else k): v for k, v in numbers.items()}
        report(step, loss, run=self.run or "hf", source=SOURCE, **numbers)


def make_callback(run: str | None = None) -> WorkbenchCallback:
    return WorkbenchCallback(run)
