"""The calls the notebook makes on each rank to drive its trainer (plain functions for ``apply``).

Each returns a small plain dict, so the notebook never unpickles a torch object.
:func:`build_default` makes the teaching setup (tiny GPT on the bundled text under a
strategy) so that ``%distrain train start --gpt tiny --strategy ddp`` works with no
cell of setup code.
"""

from __future__ import annotations

from . import trainer as trainer_mod


def build_default(
    strategy: str = "ddp",
    *,
    model: str = "tiny",
    batch_size: int = 8,
    seq_len: int = 32,
    lr: float = 1e-3,
    seed: int = 0,
    **config,
) -> dict:
    """A tiny GPT on the bundled corpus, prepared under ``strategy``, wrapped in a Trainer."""
    import torch

    from ..models import GPT, GPTConfig, TextDataset, batch_at
    from ..strategies import prepare

    presets = {"tiny": GPTConfig.tiny, "small": GPTConfig.small}
    if model not in presets:
        raise ValueError(f"unknown model preset {model!r}: use one of {', '.join(presets)}")
    cfg = presets[model](max_seq_len=seq_len)
    torch.manual_seed(seed)
    net = GPT(cfg)
    prepared = prepare(net, lambda params: torch.optim.AdamW(params, lr=lr), strategy)
    dataset = TextDataset(seq_len)
    dp_rank, dp_size = prepared.dp_rank, prepared.dp_size

    def data(i: int):
        return batch_at(dataset, batch_size, i, dp_rank=dp_rank, dp_size=dp_size, seed=seed)

    t = trainer_mod.Trainer(prepared, data=data, **config)
    return {**t.status(), "layout": repr(prepared)}


def largest_size(strategy: str, room: int, batch_size: int | None = None) -> int:
    """The most ranks, at most ``room``, that :func:`build_default` runs ``strategy`` on: its
    degrees divide the size and its global batch splits over the data-parallel ranks. Asked
    of a surviving rank when a host is lost (the notebook does not import the strategies)."""
    import inspect

    from ..strategies.spec import SpecError, StrategySpec

    if batch_size is None:
        batch_size = inspect.signature(build_default).parameters["batch_size"].default
    spec = StrategySpec.parse(strategy)
    for n in range(room, 0, -1):
        try:
            s = spec.validate(n)
        except (SpecError, ValueError):
            continue
        if batch_size % max(1, n // (s.tp * s.pp * s.cp)) == 0:
            return n
    raise ValueError(
        f"{strategy!r} fits no size of 1..{room} ranks (the hosts left) with a global batch of {batch_size}"
    )


def start(steps: int) -> dict:
    return trainer_mod.current().start(steps)


def request(action: str, reason: str = "") -> dict:
    t = trainer_mod.current()
    if action == "pause":
        t.pause(reason or "requested from the notebook")
    elif action == "resume":
        t.resume()
    elif action == "stop":
        t.stop()
    else:
        raise ValueError(f"unknown action {action!r}: pause, resume or stop")
    return t.status()


def stage(version: int, hparams: dict) -> dict:
    return trainer_mod.current().stage(version, hparams)


def status() -> dict:
    t = trainer_mod._CURRENT
    if t is None:
        return {"state": "none", "step": 0}
    return t.status()


def wait(timeout: float | None = None) -> dict:
    return trainer_mod.current().wait(timeout)


def inject(kind: str = "nan", step: int | None = None) -> dict:
    """A NaN/Inf loss or (``oom``) a simulated out-of-memory at ``step`` on this rank."""
    t = trainer_mod.current()
    t.inject(kind, step)
    return t.status()


def end_of_run(run_id: str, timeout: float) -> tuple[int, bool, str]:
    """(rank, ended, state): wait at most ``timeout`` until nothing of run ``run_id`` still works on
    this rank (its thread ended, a background save written): "finished" is final only then."""
    import concurrent.futures
    import time

    from . import fault_tolerant, runtime
    from .checkpoint import save

    deadline = time.monotonic() + timeout
    rank = runtime.context().rank if runtime._CONTEXT else 0
    ended, state = True, "none"
    t, ft = trainer_mod._CURRENT, fault_tolerant._CURRENT
    if t is not None and t.run == run_id:
        ended, state = t.ended(timeout), t.state
    elif ft is not None and ft.run == run_id:
        ft._thread.join(timeout)
        ended, state = not ft._thread.is_alive(), ft.state
    if ended:
        try:
            save.wait(max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            ended = False
        except Exception:  # a failed save reports itself (the auto-save's log line); it is over
            pass
    return rank, ended, state
