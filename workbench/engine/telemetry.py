"""Per-step measurements on a rank: phase clocks, memory, throughput and MFU.

Kept apart from the trainer so that a user's own loop (``engine.report``) and the trainer
measure the same way, and so what each measurement costs the step is seen in one place."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import sys
import time

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_LIBC = None


class PhaseClock:
    """Accumulates seconds per phase of one step (``with clock.phase("forward"): ...``).

    ``spans`` keeps each phase's ``(name, start, end)`` in ``perf_counter`` time, for the
    per-rank timeline (:mod:`.timeline`). Host clock by default. With ``new_event`` (a
    factory of timing events: ``torch.cuda.Event(enable_timing=True)``) it is a device clock:
    each phase records an event on the current stream as it starts and ends, and
    :meth:`resolve` waits for the last one and turns them into seconds, so a phase is the
    device time its stream spent between its two events (a host-only phase counts only where
    the device sat idle waiting for it). Spans are placed from the host time of the first
    phase's start: the step began with the device idle (the last step was resolved), so the
    device met that event when the host recorded it. The events are reused across steps.
    """

    def __init__(self, new_event=None):
        # on GPU the host clock would see only kernel launches (forward would look free and the
        # optimizer take the blame); one wait per step at resolve, not one per phase
        self.new_event = new_event
        self.seconds: dict[str, float] = {}
        self.spans: list[tuple[str, float, float]] = []
        self._marks: list = []  # device clock: (name, host start, start event, end event), unread
        self._events: list = []  # device clock: every event made, reused from the start each step
        self._used = 0

    def reset(self) -> None:
        """Start a new step (a device clock's events are reused: resolve the last step first)."""
        self.seconds = {}
        self.spans = []
        self._marks = []
        self._used = 0

    def _event(self):
        if self._used == len(self._events):
            self._events.append(self.new_event())
        event = self._events[self._used]
        self._used += 1
        return event

    @contextlib.contextmanager
    def phase(self, name: str):
        if self.new_event is None:
            t0 = time.perf_counter()
            try:
                yield
            finally:
                t1 = time.perf_counter()
                self.seconds[name] = self.seconds.get(name, 0.0) + t1 - t0
                self.spans.append((name, t0, t1))
            return
        start = self._event()
        start.record()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            end = self._event()
            end.record()
            self._marks.append((name, t0, start, end))

    def resolve(self) -> float | None:
        """Device clock: wait for the step's last phase to end on the device (the one wait of
        the step), add its phases to ``seconds`` and ``spans``, and return that end on the host
        clock. Host clock: nothing to do, None."""
        if not self._marks:
            return None
        marks, self._marks = self._marks, []
        marks[-1][3].synchronize()
        _, h0, first, _ = marks[0]
        for name, _, start, end in marks:
            a = h0 + first.elapsed_time(start) / 1e3  # elapsed_time is in milliseconds
            b = h0 + first.elapsed_time(end) / 1e3
            self.seconds[name] = self.seconds.get(name, 0.0) + (b - a)
            self.spans.append((name, a, b))
        return self.spans[-1][2]


def malloc_trim() -> None:
    """Give freed heap back to the OS (glibc only) so RSS reflects live memory."""
    global _LIBC
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL("libc.so.6")
        _LIBC.malloc_trim(0)
    except OSError:  # not glibc
        _LIBC = False


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        import psutil

        return psutil.Process().memory_info().rss


class MemoryProbe:
    """Memory metrics of this rank, torchtitan names on GPU, RSS/USS on CPU.

    RSS is cheap (``/proc/self/statm``); USS walks the page tables, so it (and
    ``malloc_trim``, which returns freed heap to the OS so that RSS means something) runs at
    most every ``interval`` seconds."""

    def __init__(self, device: str, interval: float = 5.0):
        self.cuda = device.startswith("cuda")
        self.interval = interval
        self._next = 0.0
        self._uss = None
        self._max_rss = 0

    def read(self) -> dict:
        out = {}
        torch = sys.modules.get("torch")
        if self.cuda and torch is not None:
            s = torch.cuda.memory_stats()
            out["memory_active_bytes"] = s.get("active_bytes.all.current", 0)
            out["memory_reserved_bytes"] = s.get("reserved_bytes.all.current", 0)
            out["memory_max_active_bytes"] = s.get("active_bytes.all.peak", 0)
            out["memory_max_reserved_bytes"] = s.get("reserved_bytes.all.peak", 0)
            # torch.cuda.memory_allocated / max_memory_allocated read these two counters
            out["memory_allocated_bytes"] = s.get("allocated_bytes.all.current", 0)
            out["memory_max_allocated_bytes"] = s.get("allocated_bytes.all.peak", 0)
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.interval
            malloc_trim()
            try:
                import psutil

                self._uss = psutil.Process().memory_full_info().uss
            except Exception:
                self._uss = None
        rss = _rss_bytes()
        self._max_rss = max(self._max_rss, rss)
        out["memory_rss_bytes"] = rss
        out["memory_uss_bytes"] = self._uss
        # the kernel's high-water mark (KiB on Linux) includes moments between our reads
        out["memory_max_rss_bytes"] = max(self._max_rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        return out


def device_peak_flops(device: str, precision: str = "bf16") -> float | None:
    """Dense peak FLOP/s of this rank's accelerator from the planner's catalogue; None on CPU."""
    if not device.startswith("cuda"):
        return None
    import torch

    from ..planner.hardware import HARDWARE

    name = torch.cuda.get_device_name().lower()
    for key, hw in HARDWARE.items():
        if key.split("-")[0] in name.replace(" ", ""):
            return hw.peak_flops(precision)
    return None


def flops_per_token(model) -> float | None:
    """Training FLOPs per token: 6 N + 12 L d s (Kaplan et al. 2020; torchtitan's count).

    Needs a ``cfg`` with ``n_layers``, ``dim``, ``max_seq_len`` (the workbench GPT);
    otherwise falls back to 6 N from the parameter count.
    """
    inner = getattr(model, "module", model)
    cfg = getattr(inner, "cfg", None)
    try:
        n = cfg.num_params() if cfg is not None else None
    except Exception:
        n = None
    if n is None:
        try:
            n = sum(p.numel() for p in inner.parameters())
        except Exception:
            return None
    from ..planner.flops import training_flops_per_token

    if cfg is not None and all(hasattr(cfg, a) for a in ("n_layers", "dim", "max_seq_len")):
        return training_flops_per_token(n, cfg.n_layers, cfg.dim, cfg.max_seq_len)
    return training_flops_per_token(n)


def throughput(tokens: int, samples: int, seconds: float, flops_tok: float | None, peak: float | None) -> dict:
    """tps, samples/s and MFU of one step on one rank."""
    seconds = max(seconds, 1e-9)
    tps = tokens / seconds
    mfu = (tps * flops_tok / peak) if (flops_tok and peak) else None
    return {"tps": tps, "samples_per_s": samples / seconds, "mfu": mfu}
