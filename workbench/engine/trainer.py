"""The training loop on a rank: runs in a background thread, obeys pause/resume/stop/set.

An ipyparallel engine answers one request at a time, so a loop run as a cell would leave the
notebook unable to pause it or even ask for its status: the loop runs beside the engine's
main thread, where control calls only flip flags. The ranks agree on those flags with the
loss once a step (:mod:`.agreement`), overlapping backward rather than stalling the step, so
a command is acted on at the same step on every rank, at worst one step later."""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, replace

import torch

from ..shared import events
from . import (
    agreement,
    batch_forms,
    comm_timing,
    data_sources,
    listeners,
    memory_report,
    publisher,
    runtime,
    staging,
    telemetry,
    timeline,
)
from .agreement import Flags

REASONS = {
    0: "requested from the notebook",
    1: "a step hook asked to pause",
    2: "loss spike",
    3: "non-finite loss or gradient",
    4: "out of memory on a rank (its report is in its status)",
}
ENDED = ("finished", "stopped", "error")  # states after which the training thread only ends
ENDING_S = 10.0  # how long a new start waits for the thread of a run that ended to be gone (its last flush)
_CURRENT: Trainer | None = None
_LAST_RUN_MS = [0]  # rank 0: the last run id handed out, in ms


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """How the loop behaves; every field can be changed later with ``train set``."""

    grad_clip: float | None = 1.0  # max total gradient norm; None or 0: no clipping
    grad_accum: int = 1  # micro-batches per optimizer step
    spike_factor: float = 10.0  # pause when loss > factor * median of the recent window
    spike_window: int = 20
    memory_interval_s: float = 5.0  # seconds between USS reads (malloc_trim + a page-table walk)
    pause_poll_s: float = 0.05  # how often paused ranks re-check their flags


class Trainer:
    """Train ``prepared`` (or ``model`` + ``optimizer``) on ``data`` in a background thread.

    ``data`` (:mod:`.data_sources`): a function ``micro_batch_index -> batch``
    (deterministic: a restored run sees the same data), an iterable of this rank's
    batches, a ``torch.utils.data.Dataset`` with ``batch_size=`` (the global micro-batch:
    the trainer shards it over the data-parallel ranks, ``shuffle``/``seed`` per epoch,
    resumable exactly) or a ``DataLoader`` (batch ``i`` to data-parallel rank
    ``i % dp_size``); the data-parallel rank and size are the ``Prepared``'s, or this
    rank and the world for a bare ``model=``. A batch (:mod:`.batch_forms`) is ``(x, y)``, a dict passed as
    ``model(**batch)`` (loss ``outputs.loss``, or ``loss_fn(outputs, batch)``), or anything
    with ``step_fn=(model, batch) -> loss``. The first batch is checked here: a batch of
    another shape is refused before any rank changes. Build one on every rank (its
    constructor agrees on a run id with the others), then ``start(steps)``; from the
    notebook ``%distrain train start --steps N``.

    Each step is timed by phase (data, forward, backward, optimizer); gradients are clipped
    (``grad_clip``). A non-finite loss or gradient norm skips the optimizer step and pauses
    every rank (they agree on the averaged loss, so all decide alike); a loss above
    ``spike_factor`` times the median of the last ``spike_window`` pauses after the step.
    The reason is kept in ``trainer.reason``; listeners (:mod:`.listeners`, auto-save among
    them) hear of the steps and state changes.
    """

    def __init__(
        self,
        prepared=None,
        *,
        model=None,
        optimizer=None,
        data,
        loss_fn=None,
        step_fn=None,
        batch_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        collate_fn=None,
        config: TrainerConfig | None = None,
        **config_changes,
    ):
        ctx = runtime.context()
        self.rank, self.world_size, self.device = ctx.rank, ctx.world_size, ctx.device
        self.config = replace(config or TrainerConfig(), **config_changes)
        if self.config.grad_accum < 1:
            raise ValueError(f"rank {self.rank}: grad_accum must be >= 1, got {self.config.grad_accum}")
        if prepared is None and (model is None or optimizer is None):
            raise ValueError("give a Prepared (from workbench.strategies.prepare) or both model= and optimizer=")
        self.prepared = prepared
        self.model = prepared.model if prepared is not None else model
        self.optimizer = prepared.optimizer if prepared is not None else optimizer
        self.loss_fn = loss_fn
        self.step_fn = step_fn
        self._data = data
        dp_rank, dp_size = (
            (prepared.dp_rank, prepared.dp_size) if prepared is not None else (self.rank, self.world_size)
        )
        self._source = data_sources.make_source(
            data,
            batch_size=batch_size,
            dp_rank=dp_rank,
            dp_size=dp_size,
            shuffle=shuffle,
            seed=seed,
            collate_fn=collate_fn,
        )
        self.micro = 0  # micro-batches consumed by the completed steps: the data position
        # a context-parallel layout shards each batch's sequence in its own ``loss``: the
        # trainer's own step (clipping, accumulation, any batch form it takes) runs around it
        self._seq_loss = prepared is not None and prepared.shards_sequence
        self._whole_step = prepared is not None and prepared.own_train_step and not self._seq_loss
        self._form = batch_forms.form_of(self._source.peek(0), step_fn=step_fn, rank=self.rank)
        if self._whole_step and (self._form != batch_forms.PAIR or loss_fn is not None):
            raise ValueError(
                f"rank {self.rank}: {type(prepared).__name__} runs its own train_step on (x, y) "
                f"batches with its own loss; this data gives {self._form} batches"
                f"{' and a loss_fn' if loss_fn is not None else ''}: lay the model out with a "
                "strategy whose step the trainer runs (ddp, fsdp2, tp, ...), or give (x, y) batches"
            )
        if self._seq_loss and (loss_fn is not None or step_fn is not None):
            raise ValueError(
                f"rank {self.rank}: a context-parallel layout computes the loss of its own sequence "
                "shard (token-weighted next-token cross entropy); drop loss_fn / step_fn, or use cp=1"
            )
        comm_timing.install()
        timeline.watch_gc()
        self.notes: list[str] = [f"data: {self._source.describe()}; batches {self._form}"]
        self._ddp_watch, note = comm_timing.watch_ddp(self.model)
        if note:
            self.notes.append(note)
        if self._whole_step:
            self.notes.append(
                f"{type(prepared).__name__} runs its own train_step: timed as one phase, "
                "no clipping or accumulation by the trainer"
            )
        if ctx.backend == "gloo" and prepared is not None and prepared.reduce_scatter:
            self.notes.append(
                "gloo has no real reduce-scatter: it runs as an all-reduce of the full "
                "buffer (gloo:all_reduce), so reduce_scatter time here is an all-reduce's"
            )
        self._channel = agreement.channel() if self.world_size > 1 else None
        self.run, generation = self._agree_run_id()
        self._agreement = agreement.Agreement(
            self._channel, generation, prepared.loss_group if prepared is not None else None, self.world_size
        )
        self._agreed: Flags | None = None  # flags agreed inside the last step, for the next
        self._agreed_s = 0.0
        self.step = 0  # completed optimizer steps
        self.target = 0
        self.state = "idle"
        self.reason = ""
        self.hooks: list = []
        self.history: deque = deque(maxlen=max(self.config.spike_window, 1))
        self._lock = threading.Lock()
        self._flags = {"stop": 0, "pause": 0, "reason": 0}
        self._local_reason = ""
        self._staging = staging.Staging(f"rank {self.rank}")
        self._thread: threading.Thread | None = None
        self._inject: dict[int, str] = {}
        self._batch_shape = None  # of the latest batch: the OOM report's activation estimate
        self._settled = False  # layout checked and train mode set since the run (re)started
        self._params: list = []  # the trainable parameters, listed when the run (re)starts
        self._memory = telemetry.MemoryProbe(self.device, self.config.memory_interval_s)
        self._flops_tok = telemetry.flops_per_token(prepared.unwrap() if prepared is not None else model)
        self._peak = telemetry.device_peak_flops(self.device)
        # one clock for the trainer's life: on CUDA its events are reused step after step
        self._clock = telemetry.PhaseClock(_timing_event if self.device.startswith("cuda") else None)
        self.last: dict = {}
        global _CURRENT
        _CURRENT = self
        staging.install(self._staging)
        listeners.trainer_built(self)  # a configured auto-save follows the newest trainer

    # -------------------------------------------------------------- identity
    def _agree_run_id(self) -> tuple[str, int]:
        """One run id on every rank, and the trainer's agreement generation: rank 0's clock
        in ms (one more than the last where trainers come faster), broadcast."""
        _LAST_RUN_MS[0] = max(int(time.time() * 1000), _LAST_RUN_MS[0] + 1)
        t = torch.tensor([_LAST_RUN_MS[0]], dtype=torch.int64)
        if self._channel is not None:
            comm_timing.original("broadcast")(t, src=0, group=self._channel.group)
        ms = int(t.item())
        _LAST_RUN_MS[0] = max(_LAST_RUN_MS[0], ms)
        return time.strftime("run-%Y%m%d-%H%M%S", time.localtime(ms / 1000)) + f"-{ms % 1000:03d}", ms

    # ------------------------------------------------------------- controls
    def add_hook(self, fn, every: int = 1, *, pauses: bool = True) -> None:
        """Call ``fn(record)`` after every ``every``-th step on this rank's training thread.

        ``record`` is the step's metrics dict (``step``, ``loss``, ``lr``, ...). A hook may
        call ``trainer.pause("why")``: the run pauses on every rank before the next step.
        For that, the ranks agree once more after a step where such a hook ran on any
        rank; a hook that never pauses (logging, timing) says ``pauses=False`` and costs
        no agreement.
        """
        with self._lock:
            self.hooks = [*self.hooks, (fn, max(1, int(every)), bool(pauses))]

    def remove_hook(self, fn) -> bool:
        """Remove every registration of ``fn``; True when there was one."""
        with self._lock:
            kept = [h for h in self.hooks if h[0] is not fn]
            removed, self.hooks = len(kept) != len(self.hooks), kept
        return removed

    @property
    def pausing(self) -> bool:
        """A pause was asked on this rank (notebook, hook, NaN, spike, OOM) and not resumed yet.

        True already during the step that asked for it, before ``state`` becomes "paused".
        """
        with self._lock:
            return bool(self._flags["pause"])

    def pause(self, reason: str = "", code: int = 0) -> None:
        with self._lock:
            self._flags["pause"] = 1
            self._flags["reason"] = max(self._flags["reason"], code if reason or code else 0)
            self._local_reason = reason or REASONS[code]

    def resume(self) -> None:
        with self._lock:
            self._flags["pause"] = 0
            self._flags["reason"] = 0
            self._local_reason = ""

    def stop(self) -> None:
        with self._lock:
            self._flags["stop"] = 1

    def stage(self, version: int, hparams: dict) -> dict:
        """Check and hold hyperparameter changes; :meth:`commit` makes them take effect
        at the step where every rank has seen the commit."""
        groups = self.optimizer.param_groups
        clean = {}
        for key, value in hparams.items():
            if hasattr(self.config, key):
                clean[key] = value
            elif all(key in g for g in groups):
                old = groups[0][key]
                clean[key] = (
                    tuple(value)
                    if isinstance(old, tuple)
                    else type(old)(value)
                    if isinstance(old, (int, float)) and not isinstance(old, bool)
                    else value
                )
            else:
                known = sorted(
                    {k for g in groups for k in g if k != "params"} | set(TrainerConfig.__dataclass_fields__)
                )
                raise KeyError(
                    f"rank {self.rank}: {key!r} is not a hyperparameter of "
                    f"{type(self.optimizer).__name__} or the trainer; known: {', '.join(known)}"
                )
        self._staging.stage(version, lambda tr: tr._set_hparams(clean))
        return clean

    def stage_call(self, version: int, fn) -> None:
        """Hold ``fn(trainer)`` to run on the training thread at the step where ``version``
        is committed: the same step on every rank (attach or remove a listener mid-run)."""
        self._staging.stage(version, fn)

    def commit(self, version: int) -> None:
        self._staging.commit(version)

    def next_version(self) -> int:
        """A change version not used yet on this rank (the notebook takes the max over ranks)."""
        return self._staging.next_version()

    def _set_hparams(self, hp: dict) -> None:
        for key, value in hp.items():
            if hasattr(self.config, key):
                self.config = replace(self.config, **{key: value})
            else:
                for g in self.optimizer.param_groups:
                    g[key] = value
        publisher.emit(
            events.log_event(
                run=self.run,
                rank=self.rank,
                text=f"step {self.step + 1}: set " + ", ".join(f"{k}={v}" for k, v in hp.items()),
            )
        )

    def set(self, **hparams) -> None:
        """Change hyperparameters at the next step (this rank's call; the notebook calls all)."""
        version = self.next_version()
        self.stage(version, hparams)
        self.commit(version)

    def inject(self, kind: str = "nan", step: int | None = None) -> None:
        """Fault drill: make the loss of step ``step`` (default: the next) NaN or Inf on this rank,
        or (``oom``) raise a simulated out-of-memory in that step."""
        if kind not in ("nan", "inf", "oom"):
            raise ValueError(f"inject kind must be 'nan', 'inf' or 'oom', got {kind!r}")
        self._inject[self.step + 1 if step is None else step] = kind

    # ------------------------------------------------------------- running
    def start(self, steps: int) -> dict:
        """Run ``steps`` more steps in the background; returns at once."""
        if self._thread is not None and self._thread.is_alive() and self.state in ENDED:
            self._thread.join(ENDING_S)  # its loop is over: only its last events are still on their way
        if self._thread is not None and self._thread.is_alive():
            if self.state in ENDED:
                raise RuntimeError(
                    f"rank {self.rank}: the run {self.run} {self.state} at step {self.step}, and its training "
                    f"thread has not ended {ENDING_S:g} s later (a listener of its end is still busy); try again"
                )
            raise RuntimeError(
                f"rank {self.rank}: training is already {self.state} at step {self.step}: "
                "pause/resume/stop it, or wait for it to finish"
            )
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        with self._lock:
            self._flags.update(stop=0, pause=0, reason=0)
            self._local_reason = ""
        self.target = self.step + int(steps)
        self.state = "running"
        self._settled = False
        self._thread = threading.Thread(target=self._loop, name="workbench-trainer", daemon=True)
        self._thread.start()
        return self.status()

    @property
    def looping(self) -> bool:
        """The training thread is alive (running, or paused between steps)."""
        return self._thread is not None and self._thread.is_alive()

    def on_training_thread(self) -> bool:
        return self._thread is threading.current_thread()

    def restore_position(self, step: int, data: dict | None, loss) -> str | None:
        """Continue from a loaded checkpoint's ``step`` and data position, with a fresh loss
        window; returns a note where the data cannot continue exactly."""
        self.step = int(step)
        note = self.restore_data(data, self.step)
        self.target = max(self.target, self.step)
        self.history.clear()
        self.last = {"step": self.step, "loss": loss}
        return note

    def wait(self, timeout: float | None = None) -> dict:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.status()

    def ended(self, timeout: float | None = None) -> bool:
        """True once the training thread has ended (waiting at most ``timeout``): the run's state
        is final and its last events were handed to the stream."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.looping

    def status(self) -> dict:
        return {
            "rank": self.rank,
            "run": self.run,
            "state": self.state,
            "step": self.step,
            "target": self.target,
            "reason": self.reason,
            "notes": list(self.notes),
        }

    def _set_state(self, state: str, reason: str = "") -> None:
        self.state, self.reason = state, reason
        publisher.emit(events.status_event(run=self.run, rank=self.rank, state=state, step=self.step, reason=reason))
        listeners.state_changed(self, state, reason)

    def _local_flags(self, hooks_due: int = 0) -> Flags:
        with self._lock:
            return Flags(
                stop=self._flags["stop"],
                pause=self._flags["pause"],
                version=self._staging.committed,
                reason=self._flags["reason"],
                hooks_due=hooks_due,
            )

    def _agree(self) -> tuple[Flags, float]:
        """The flags to act on now: those agreed inside the last step, else agreed here."""
        if self._agreed is not None:
            agreed, self._agreed = self._agreed, None
            return agreed, self._agreed_s
        return self._agreement.flags(self._local_flags())

    def _pause_agreed(self, code: int) -> None:
        """Make the flags agreed inside this step pause the next one (for a pause every rank
        decides alike, or an out-of-memory after the agreement)."""
        if self._agreed is not None:
            self._agreed = self._agreed._replace(pause=1, reason=max(self._agreed.reason, code))

    def _hooks_due(self, step: int) -> int:
        return int(any(pauses and step % every == 0 for _, every, pauses in self.hooks))

    def _apply_staged(self, version: int) -> None:
        for change in self._staging.due(version):
            change(self)

    def _loop(self) -> None:
        if self.device.startswith("cuda"):  # a new thread starts on CUDA's device 0, not the rank's
            torch.cuda.set_device(self.device)
        self._set_state("running")
        try:
            while True:
                flags, control_s = self._agree()
                self._apply_staged(flags.version)
                stop, pause, code = flags.stop, flags.pause, flags.reason
                if stop:
                    self._set_state("stopped", "stopped from the notebook")
                    break
                if pause:
                    self._settled = False  # cells may run while paused: check again on resume
                    if self.state != "paused":
                        self._set_state("paused", self._local_reason or REASONS.get(code, ""))
                    time.sleep(self.config.pause_poll_s)
                    continue
                if self.state == "paused":
                    self._set_state("running", "resumed")
                if self.step >= self.target:
                    self._set_state("finished", f"{self.target} steps done")
                    break
                self._guarded_step(control_s)
        except data_sources.DataExhausted as exc:  # a one-shot iterator ran out: the run ends there
            self._set_state("finished", f"{exc} (step {self.step})")
        except Exception as exc:  # the loop must never die silently
            self._set_state("error", f"rank {self.rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        finally:
            self._agreed = None
            with self._lock:
                self._flags["stop"] = 0
            publisher.flush(10.0)

    # ---------------------------------------------------------------- a step
    def _guarded_step(self, control_s: float) -> None:
        """One step; an out-of-memory pauses the run with this rank's memory breakdown and advice.

        The step is not counted (retry after ``train set grad_accum=2`` or a new layout). A
        rank that runs out of memory alone leaves its peers waiting in the step's collective:
        ``train start --step-timeout S`` then shows where each rank waits.
        """
        try:
            with memory_report.explain_oom(
                self.prepared or self.model, self.optimizer, batch_shape=lambda: self._batch_shape
            ):
                self._one_step(control_s)
        except (torch.OutOfMemoryError, MemoryError) as exc:
            if self.optimizer is not None:
                self.optimizer.zero_grad(set_to_none=True)
            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()
            reason = f"step {self.step + 1}: {exc}"
            self.pause(reason, code=4)
            self._pause_agreed(4)  # out of memory after the agreement: pause at the next step
            self._set_state("paused", reason)  # at once: peers may be stuck in the step's collective

    def _next_batch(self, micro: int):
        batch = self._source.take(micro)
        form = batch_forms.form_of(batch, step_fn=self.step_fn, rank=self.rank)
        if form != self._form:
            raise batch_forms.BadBatch(
                f"rank {self.rank}: micro-batch {micro} is a {form} batch "
                f"({batch_forms.describe(batch)}), the first was a {self._form} one"
            )
        self._batch_shape = batch_forms.counts(batch)[2]
        return batch

    # ------------------------------------------------------------ data position
    def data_state(self) -> dict:
        """Where the run is in its data (JSON; saved with checkpoints)."""
        return {**self._source.state(self.micro), "grad_accum": int(self.config.grad_accum)}

    def restore_data(self, state: dict | None, step: int) -> str | None:
        """Continue the data after a checkpoint load at ``step``; a note where it cannot be exact."""
        state = dict(state or {})
        self.micro = int(state["micro_batch"]) if "micro_batch" in state else step * self.config.grad_accum
        return self._source.restore(self.micro, state)

    def _loss(self, model, batch, autocast=None):
        if self._seq_loss:
            return self.prepared.loss(batch)
        if self.prepared is not None:
            compute = self.prepared.compute_loss
        else:
            from ..strategies.base import lm_loss as compute
        return batch_forms.forward_loss(
            model,
            batch,
            self._form,
            loss_fn=self.loss_fn,
            compute_loss=compute,
            step_fn=self.step_fn,
            rank=self.rank,
            autocast=autocast,
        )

    def _one_step(self, control_s: float) -> None:
        clock = self._clock
        clock.reset()
        comm_before = comm_timing.STATS.snapshot()
        spans_before = comm_timing.STATS.span_count
        t0 = time.perf_counter()
        step = self.step + 1
        tokens = samples = 0
        grad_norm = None
        inject = self._inject.pop(step, None)
        listeners.step_begun(self, step)
        if inject == "oom":
            self._simulate_oom(step)
        if self._whole_step:
            with clock.phase("data"):
                batch = self._next_batch(self.micro)
            with clock.phase("forward"):
                loss_global = self.prepared.train_step(batch)
            loss_local = loss_global
            tokens, samples, _ = batch_forms.counts(batch)
            if inject:
                loss_global = float(inject)
            self.micro += 1
        else:
            loss_global, loss_local, grad_norm, tokens, samples = self._decomposed(clock, step, inject)
            self.micro += self.config.grad_accum
        bad = not math.isfinite(loss_global) or (grad_norm is not None and not math.isfinite(grad_norm))
        spike = False
        if not bad and len(self.history) >= self.history.maxlen:
            spike = loss_global > self.config.spike_factor * statistics.median(self.history)
        if not bad:
            self.history.append(loss_global)
        if bad or spike:  # decided alike on every rank from the agreed loss: act at once
            self._pause_agreed(3 if bad else 2)
        self.step = step
        ddp = None
        if self._ddp_watch is not None:
            with clock.phase("telemetry"):  # reading DDP's reducer clock
                ddp = self._ddp_watch.last if self._ddp_watch.record() else None
        t1 = time.perf_counter()
        memory = self._memory.read()  # on CUDA while the step's last kernels run
        end = clock.resolve()  # on CUDA the step's one wait, then its end as the device met it
        if end is not None:
            t1 = end
        seconds = t1 - t0
        timeline.record(
            run=self.run,
            rank=self.rank,
            step=step,
            t0=t0,
            t1=t1,
            phases=clock.spans,
            comm=comm_timing.STATS.spans_since(spans_before),
            ddp=ddp,
        )
        if self._agreed is not None:  # agreed inside this step (with the loss): that is its cost
            control_s = self._agreed_s
        comm, blocking_s = comm_timing.CommStats.delta(comm_timing.STATS.snapshot(), comm_before)
        metrics = {
            "loss": loss_global,
            "loss_local": loss_local,
            "lr": self.optimizer.param_groups[0].get("lr"),
            "grad_norm": grad_norm,
            "time_step_s": seconds,
            "time_control_s": control_s,
        }
        for phase in events.STEP_TIME_PHASES:
            metrics[f"time_{phase}_s"] = clock.seconds.get(phase, 0.0)
        metrics["time_comm_wait_s"] = blocking_s
        metrics.update(telemetry.throughput(tokens, samples, seconds, self._flops_tok, self._peak))
        metrics.update(memory)
        self.last = {"step": step, **metrics}
        publisher.emit(events.step_event(run=self.run, rank=self.rank, step=step, metrics=metrics, comm=comm))
        if bad:
            self.pause(
                f"non-finite loss ({loss_global}) or grad_norm ({grad_norm}) at step {step}: optimizer step skipped",
                code=3,
            )
        elif spike:
            self.pause(
                f"loss spike at step {step}: {loss_global:.4g} > {self.config.spike_factor} x median "
                f"{statistics.median(self.history):.4g} of the last {len(self.history)} steps",
                code=2,
            )
        for fn, every, _pauses in self.hooks:  # a snapshot: add/remove_hook replace the list
            if step % every == 0:
                fn(dict(self.last))
        listeners.step_ended(self, dict(self.last))
        if self._agreed is not None and self._agreed.hooks_due:  # a hook ran somewhere: agree again
            flags, seconds = self._agreement.flags(self._local_flags())
            self._agreed, self._agreed_s = flags, self._agreed_s + seconds

    def _no_sync(self, enabled: bool):
        """Skip gradient sync for an accumulation micro-batch (the strategy's own way)."""
        if not enabled:
            return contextlib.nullcontext()
        return self.prepared.no_sync() if self.prepared is not None else _module_no_sync(self.model)

    def _simulate_oom(self, step: int):
        kind = torch.OutOfMemoryError if self.device.startswith("cuda") else MemoryError
        raise kind(f"rank {self.rank}: out of memory in step {step} (simulated by inject('oom'))")

    def _decomposed(self, clock, step: int, inject):
        """Forward/backward per micro-batch, clip, optimizer step; returns the numbers."""
        model, opt, accum = self.model, self.optimizer, self.config.grad_accum
        if not self._settled:  # once per (re)start, not every step (benchmarks/FINDINGS.md)
            with clock.phase("setup"):
                if self.prepared is not None:
                    self.prepared.check()
                model.train()
                # the parameters clipping looks at (walking the module tree for them every step showed in profiles)
                self._params = [p for p in model.parameters() if p.requires_grad]
                self._settled = True
        elif not model.training:  # a hook switched to eval and did not switch back
            model.train()
        with clock.phase("zero_grad"):  # its first call also sets up the optimizer's hooks
            opt.zero_grad(set_to_none=True)
        total = 0.0
        tokens = samples = 0
        autocast = self.prepared._autocast_ctx if self.prepared is not None else None
        device = torch.device(self.device)
        for i in range(accum):
            with clock.phase("data"):
                batch = batch_forms.to_device(self._next_batch(self.micro + i), device)
            n_tok, n_samples, _ = batch_forms.counts(batch)
            tokens += n_tok
            samples += n_samples
            last = i == accum - 1
            with self._no_sync(enabled=not last):
                with clock.phase("forward"):
                    begin = getattr(self.prepared, "begin_forward", None)  # CUDA graphs: a new step
                    if begin is not None:
                        begin()
                    loss = self._loss(model, batch, autocast) / accum
                    if inject:
                        loss = loss * float(inject)
                total += float(loss.detach())
                if last:  # the loss averaged over the data-parallel ranks, the flags for the
                    # next step, and whether a step hook runs after this one on some rank (it
                    # may ask to pause): agreed while backward runs
                    agreeing = self._agreement.with_loss(self._local_flags(self._hooks_due(step)), total)
                with clock.phase("backward"):
                    loss.backward()
        with clock.phase("optimizer"):
            grad_norm = self._clip()
        with clock.phase("agreement"):  # waits here only for a rank that is behind (timeline)
            self._agreed, loss_global, self._agreed_s = agreeing.result()
        with clock.phase("optimizer"):
            if math.isfinite(loss_global) and math.isfinite(grad_norm):
                opt.step()
            else:
                opt.zero_grad(set_to_none=True)
        return loss_global, total, grad_norm, tokens, samples

    def _clip(self) -> float:
        """Total gradient norm (DTensor-aware, as torchtitan), clipped to ``grad_clip``."""
        params = [p for p in self._params if p.grad is not None]
        if not params:
            return 0.0
        # One norm per kind of gradient: plain tensors (replicated: counted once) and DTensors
        # of each mesh/placement (a TP plan leaves norms plain; 2-D has 1-D and 2-D meshes),
        # which torch's foreach norm will not mix.
        groups: dict = {}
        for p in params:
            g = p.grad
            key = (id(g.device_mesh), tuple(g.placements)) if hasattr(g, "full_tensor") else None
            groups.setdefault(key, []).append(p)
        squares = []
        for ps in groups.values():
            n = torch.nn.utils.get_total_norm([p.grad for p in ps], 2.0, False, True)
            squares.append((n.full_tensor() if hasattr(n, "full_tensor") else n).float() ** 2)
        norm = torch.stack(squares).sum().sqrt()
        clip = self.config.grad_clip
        if clip and math.isfinite(float(norm)):
            for ps in groups.values():
                torch.nn.utils.clip_grads_with_norm_(ps, clip, norm, True)
        return float(norm)


def _timing_event():
    return torch.cuda.Event(enable_timing=True)


def _module_no_sync(model):
    """Skip gradient sync on a bare module the user wrapped (DDP, FSDP2); nothing else to skip."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return model.no_sync()
    if isinstance(model, FSDPModule):
        from ..strategies.fsdp2 import fsdp_no_sync

        return fsdp_no_sync(model)
    return contextlib.nullcontext()


def current() -> Trainer:
    """This rank's latest trainer; a clear error where none was built."""
    if _CURRENT is None:
        raise RuntimeError(
            f"rank {runtime.context().rank}: no trainer on this rank: build one in a %%distrain "
            "cell (Trainer(prepared, data=...)) or `%distrain train start --gpt tiny`"
        )
    return _CURRENT
