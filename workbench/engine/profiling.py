"""``torch.profiler`` on this rank for N steps of its trainer, a Chrome/Perfetto trace out.

The profiler records the thread it was started on and the trainer steps on its own thread,
so a step hook (``pauses=False``: no extra agreement between ranks) starts it on the training
thread after one step and stops it N steps later: N whole steps, each ``ProfilerStep#k``.
At most one profile per rank at a time; :func:`status` and :func:`cancel` follow it."""

from __future__ import annotations

import os
import threading
import time

__all__ = ["arm", "status", "cancel", "read_trace"]

_LOCK = threading.Lock()
_STATE: dict = {}  # "steps", "done", "path", "error", "prof", "hook", "trainer", "started_step"


def _activities():
    import torch
    from torch.profiler import ProfilerActivity

    acts = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    return acts


def arm(steps: int, out_dir: str, *, partial: str = "") -> dict:
    """Profile the next ``steps`` steps of this rank's trainer; the trace goes to
    ``out_dir/rank{r}.trace.json``. Returns at once; :func:`status` follows it.
    ``partial`` names the profiled ranks where they are not all of them ("" for all). A
    trainer that is not running is started for exactly those steps (one more to arm) when
    every rank is profiled; with some ranks only that is refused, since a step needs them all."""
    from . import runtime
    from . import trainer as trainer_mod

    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    t = trainer_mod.current()
    if partial and t.state != "running":
        raise ValueError(
            f"rank {t.rank}: no training steps are running (the trainer is {t.state}), and profiling "
            f"rank(s) {partial} alone cannot start them: a step needs every rank. Start the trainer "
            "(`%distrain train start`) and profile while it runs, profile every rank (no --ranks), "
            "or profile a cell (`%distrain profile --code '...'`)"
        )
    if t.state == "running" and t.target - t.step < steps + 1:
        raise ValueError(
            f"rank {t.rank}: the trainer has {t.target - t.step} step(s) left of its run, fewer than "
            f"the {steps} to profile + 1 to arm: profile fewer steps, or after it finishes"
        )
    with _LOCK:
        if _STATE and not _STATE.get("done"):
            raise RuntimeError(
                f"rank {t.rank}: a profile is already under way ({_STATE['seen']}/{_STATE['steps']} "
                "steps): wait for it or cancel it"
            )
        rank = runtime.context().rank
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, f"rank{rank}.trace.json")
        _STATE.clear()
        _STATE.update(
            steps=int(steps),
            seen=0,
            done=False,
            path=path,
            error=None,
            prof=None,
            trainer=t,
            started_step=None,
            armed_at=time.time(),
        )

    def hook(record):
        with _LOCK:
            st = _STATE
            if st.get("hook") is not hook or st.get("done"):
                return
            if st.get("cancel"):  # asked from the engine's thread: stopped here, between steps
                _finish(st)
                return
            try:
                if st["prof"] is None:
                    import warnings

                    from torch.profiler import profile, schedule

                    path = st["path"]
                    # a schedule makes the profiler mark each step (ProfilerStep#k) and write
                    # the trace when the last active step ends
                    prof = profile(
                        activities=_activities(),
                        record_shapes=False,
                        with_stack=False,
                        schedule=schedule(wait=0, warmup=0, active=st["steps"], repeat=1),
                        on_trace_ready=lambda p: p.export_chrome_trace(path),
                    )
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # "won't be using warmup": every step is wanted
                        prof.start()
                    st["prof"], st["started_step"] = prof, record["step"]
                    return
                st["prof"].step()
                st["seen"] += 1
                if st["seen"] >= st["steps"]:
                    _finish(st)
            except Exception as exc:  # never break the training loop for a profile
                st["error"] = f"{type(exc).__name__}: {exc}"
                _finish(st)

    _STATE["hook"] = hook
    t.add_hook(hook, every=1, pauses=False)
    if t.state != "running":
        t.start(steps + 1)  # one step to arm, then the profiled ones
    return status()


def _finish(st: dict) -> None:
    """Stop the profiler, write the trace, remove the hook (called with the lock held)."""
    prof, st["prof"] = st.get("prof"), None
    if prof is not None:
        try:
            prof.stop()
        except Exception as exc:
            st["error"] = st.get("error") or f"{type(exc).__name__}: {exc}"
    if st.get("error") is None and not os.path.exists(st["path"]):
        st["error"] = "the profiler wrote no trace"
    trainer, hook = st.get("trainer"), st.get("hook")
    if trainer is not None and hook is not None:
        trainer.remove_hook(hook)
    st["done"] = True
    st["trainer"] = None


def status() -> dict:
    """``{"steps", "seen", "done", "path", "error", "profiling", "trainer_state"}`` of this rank's profile."""
    import torch

    with _LOCK:
        if _STATE:
            _settle(_STATE)
        st = dict(_STATE)
    t = st.get("trainer")
    return {
        "steps": st.get("steps"),
        "seen": st.get("seen", 0),
        "done": bool(st.get("done", not st)),
        "path": st.get("path"),
        "error": st.get("error"),
        "started_step": st.get("started_step"),
        "profiling": torch.autograd.profiler._is_profiler_enabled,
        "trainer_state": t.state if t is not None else None,
    }


def cancel() -> dict:
    """Stop a profile where it is (no trace written), remove its hook. While the trainer
    runs, its own thread stops the profiler at the end of the step: stopping it from this
    thread in the middle of the step's ops crashes the rank."""
    with _LOCK:
        if _STATE and not _STATE.get("done"):
            _STATE["error"] = "cancelled"
            _STATE["cancel"] = True
            _settle(_STATE)
    return status()


def _settle(st: dict) -> None:
    """Finish a cancelled profile here once no step can run it (called with the lock held)."""
    t = st.get("trainer")
    if st.get("cancel") and not st.get("done") and (st.get("prof") is None or t is None or t.state != "running"):
        _finish(st)


def read_trace() -> bytes:
    """The finished trace file's bytes (for a notebook on another host)."""
    with _LOCK:
        path, done, error = _STATE.get("path"), _STATE.get("done"), _STATE.get("error")
    if not done or error or not path:
        raise RuntimeError(f"no finished trace on this rank ({error or 'not done yet'})")
    with open(path, "rb") as f:
        return f.read()


def profile_code(code: str, out_dir: str) -> dict:
    """Run ``code`` as a cell of this rank's namespace under ``torch.profiler`` (on this, the
    engine's thread), marked as one step; the trace goes to ``out_dir/rank{r}.trace.json``."""
    import torch
    from torch.profiler import profile, record_function

    import __main__

    from . import runtime

    with _LOCK:
        if _STATE and not _STATE.get("done"):
            raise RuntimeError("a profile of the trainer is under way on this rank: wait for it or cancel it")
    rank = runtime.context().rank
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"rank{rank}.trace.json")
    compiled = compile(code, f"<profiled cell on rank {rank}>", "exec")
    with profile(activities=_activities(), record_shapes=False, with_stack=False) as prof:
        with record_function("ProfilerStep#0"):
            exec(compiled, vars(__main__))
            if torch.cuda.is_available():
                torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    with _LOCK:
        _STATE.clear()
        _STATE.update(steps=1, seen=1, done=True, path=path, error=None, prof=None, trainer=None)
    return status()
