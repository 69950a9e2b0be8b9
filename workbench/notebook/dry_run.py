"""``workbench.dry_run(build, gpus=512, tp=8, pp=8)``: a layout at full scale, on this CPU.

The model is laid out by the workbench's strategies once per distinct rank position, under
torch's fake process group at the full world size, on fake tensors, and steps once; the
report (:class:`~workbench.notebook.dry_run_report.DryRun`) sets it beside the planner. The
work runs in a process of its own (:mod:`workbench.engine.dry_run.server`): this kernel never
imports torch. See docs/dry-run.md."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

from ..shared.dry_run import DryRunError, DryRunRequest, DryRunResult
from .dry_run_report import DryRun

__all__ = ["dry_run", "spec_text", "DryRunError"]

DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")
PRECISIONS = ("bf16", "fp32")
RECOMPUTE = ("none", "full", "selective")
SCHEDULES = ("1f1b", "gpipe")


def spec_text(
    strategy: str,
    *,
    gpus: int,
    tp: int = 1,
    pp: int = 1,
    dp_shard: int | None = None,
    dp_replicate: int = 1,
    cp: int = 1,
    ep: int = 1,
    precision: str = "bf16",
    recompute: str = "none",
    schedule: str = "1f1b",
    microbatches: int | None = None,
) -> str:
    """The ``StrategySpec`` text the dry run prepares with (``"fsdp2 tp=8 pp=8 dtype=bf16 ..."``);
    the strategies parse and check it on the dry run's side."""
    words = str(strategy).split()
    named = {re.split(r"[=\s]", w.lstrip("-"), maxsplit=1)[0].replace("-", "_") for w in words[1:]}
    given = {"dp_replicate": dp_replicate, "dp_shard": dp_shard, "cp": cp, "tp": tp, "pp": pp, "ep": ep}
    both = sorted(n for n, v in given.items() if v not in (None, 1) and n in named)
    if both:
        raise DryRunError(f"{', '.join(both)} given twice: in strategy={strategy!r} and as keywords; give each once")
    if precision not in PRECISIONS:
        raise DryRunError(
            f"precision={precision!r}: the dry run lays out {' or '.join(PRECISIONS)} (fp16 and fp8 need a GPU)"
        )
    if recompute not in RECOMPUTE:
        raise DryRunError(f"recompute={recompute!r} is not one of {', '.join(RECOMPUTE)}")
    if schedule not in SCHEDULES:
        raise DryRunError(
            f"schedule={schedule!r} is not one of {', '.join(SCHEDULES)} (the pipeline schedules laid out here)"
        )
    parts = [*words]
    parts += [f"{name}={int(v)}" for name, v in given.items() if v not in (None, 1) and name not in named]
    parts.append(f"dtype={precision}")
    if recompute != "none":
        parts.append(f"ac={recompute}")
    if pp > 1:
        parts += [f"schedule={schedule}", f"mb={microbatches or pp}"]
    return " ".join(parts)


def _check_positive(**values) -> None:
    for name, v in values.items():
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise DryRunError(f"{name}={v!r} must be a positive integer")


def dry_run(
    build,
    *,
    gpus: int,
    tp: int = 1,
    pp: int = 1,
    dp_shard: int | None = None,
    dp_replicate: int = 1,
    cp: int = 1,
    ep: int = 1,
    strategy: str = "fsdp2",
    batch: int | None = None,
    seq: int | None = None,
    microbatches: int | None = None,
    schedule: str = "1f1b",
    precision: str = "bf16",
    recompute: str = "none",
    hw: str = "h100",
    optimizer=None,
    blocks=None,
    tp_plan: dict | None = None,
    pp_boundaries=None,
    every_rank: bool = False,
    timeout: float = 900.0,
) -> DryRun:
    """Dry-run ``build``'s model laid out over ``gpus`` ranks; the :class:`DryRun` report.

    ``build``: a function returning the model (an ``nn.Module``, built under the meta
    device, or a transformers config), a transformers config, or a planner catalogue name
    (``"8b"``, ``"70b"``: a transformers Llama config with the catalogue's numbers).
    Degrees as in ``prepare`` (``dp_shard`` takes the rest by default); ``strategy`` is the
    preset they start from. ``batch``: sequences per data-parallel rank in one step
    (default: one per micro-batch), of ``seq`` tokens (default: the catalogue model's);
    ``microbatches`` (``pp``; default ``pp``) and ``schedule`` as in the pipeline;
    ``hw``: the accelerator the planner's side is for. ``every_rank=True`` builds every
    rank instead of one per position and checks that each equals its position (small worlds).
    A layout that cannot work raises :class:`DryRunError` with the strategy's own message.
    """
    _check_positive(gpus=gpus, tp=tp, pp=pp, dp_shard=dp_shard, dp_replicate=dp_replicate, cp=cp, ep=ep)
    _check_positive(batch=batch, seq=seq, microbatches=microbatches)
    from ..planner import ModelSpec
    from ..planner.hardware import load_hardware

    try:
        load_hardware(hw)
    except ValueError as exc:
        raise DryRunError(str(exc)) from None
    if microbatches is not None and pp == 1:
        raise DryRunError(f"microbatches={microbatches} needs pp > 1 (micro-batches are the pipeline's)")
    if seq is None:
        if not isinstance(build, str):
            raise DryRunError("give seq= (tokens per sequence); only a catalogue model name carries its own")
        try:
            seq = ModelSpec.preset(build).seq_len
        except ValueError as exc:
            raise DryRunError(str(exc)) from None
    m = microbatches or pp
    if batch is None:
        batch = m if pp > 1 else 1
    if pp > 1 and batch % m:
        raise DryRunError(f"batch={batch} does not split into microbatches={m}; use a multiple of {m}")
    if every_rank and gpus > 64:
        raise DryRunError(f"every_rank=True builds all {gpus} ranks: use it on 64 ranks or fewer")
    text = spec_text(
        strategy,
        gpus=gpus,
        tp=tp,
        pp=pp,
        dp_shard=dp_shard,
        dp_replicate=dp_replicate,
        cp=cp,
        ep=ep,
        precision=precision,
        recompute=recompute,
        schedule=schedule,
        microbatches=microbatches,
    )
    request = DryRunRequest(
        build=build,
        world=gpus,
        spec=text,
        batch=batch,
        seq=seq,
        optimizer=optimizer,
        blocks=blocks,
        tp_plan=tp_plan,
        pp_boundaries=tuple(pp_boundaries) if pp_boundaries is not None else None,
        every_rank=every_rank,
    )
    result = run_request(request, timeout=timeout)
    catalogue = build if isinstance(build, str) else None
    return DryRun(result, request=request, hardware=hw, catalogue=catalogue)


def run_request(request: DryRunRequest, *, timeout: float = 900.0) -> DryRunResult:
    """Send ``request`` to a dry-run process of its own; its :class:`DryRunResult`.

    The process sees this kernel's ``sys.path`` (a build function from a module the notebook
    imports is pickled by reference, and found there). It and the positions it forks form a
    process group of their own, ended as a whole on a timeout or an interrupt."""
    import cloudpickle

    payload = cloudpickle.dumps(request)
    path = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench.engine.dry_run.server"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path},
    )
    try:
        out, err = proc.communicate(payload, timeout=timeout)
    except subprocess.TimeoutExpired:
        _end(proc)
        raise DryRunError(f"the dry run took longer than timeout={timeout:g} s and was stopped") from None
    except BaseException:
        _end(proc)
        raise
    line = next((ln for ln in reversed(out.decode(errors="replace").splitlines()) if ln.startswith("{")), None)
    if line is None:
        tail = " ".join(err.decode(errors="replace").strip().splitlines()[-3:])
        raise DryRunError(f"the dry-run process ended (exit {proc.returncode}) without a report: {tail}")
    reply = json.loads(line)
    if "error" in reply:
        exc = DryRunError(reply["error"])
        exc.detail = reply.get("detail", "")
        raise exc
    return DryRunResult.from_dict(reply)


def _end(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# flags of the planner a dry run cannot honour, and why (a flag is never accepted and ignored)
_NOT_DRY = {
    "offload": "--offload / --nvme: optimizer offload is DeepSpeed's, on live ranks",
    "nvme": "--offload / --nvme: optimizer offload is DeepSpeed's, on live ranks",
    "lora": "--lora: give a build function that returns the peft model (--build VAR)",
    "tokens": "--tokens / --price: the dry run counts memory and collectives, not the run's cost; plan without --dry-run for that",
    "price": "--tokens / --price: the dry run counts memory and collectives, not the run's cost; plan without --dry-run for that",
    "virtual_stages": "--virtual-stages / interleaved: the pipeline schedules laid out here are 1f1b and gpipe",
    "no_sp": "--no-sp: the dry run lays the model out with its own tensor-parallel plan, whose entries decide sequence parallel",
}


def dry_run_from_args(argv: list[str], shell=None) -> DryRun:
    """``%distrain plan --dry-run ...``: the planner's flags describe the layout; ``--model``
    names a catalogue model, or ``--build VAR`` a notebook variable holding the build
    function (or a transformers config; ``--seq-len`` then says the sequence length).
    ``--hw`` defaults to h100 and ``-m`` (micro-batches) to ``pp``: every micro-batch is
    stepped through, where the planner's default (a ~4M-token batch) would be dozens."""
    from ..planner.arguments import layout_from_args

    argv = [a for a in argv if a != "--dry-run"]
    build = None
    if "--build" in argv:
        i = argv.index("--build")
        if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
            raise DryRunError("--build needs the name of a notebook variable holding a function that returns the model")
        name = argv[i + 1]
        argv = argv[:i] + argv[i + 2 :]
        ns = getattr(shell, "user_ns", None) or {}
        if name not in ns:
            raise DryRunError(
                f"--build {name}: no notebook variable {name!r} (a function returning the model or its config)"
            )
        if "--model" in argv:
            raise DryRunError("give --model NAME (a catalogue model) or --build VAR (your model), not both")
        build = ns[name]
        if "--seq-len" not in argv:
            raise DryRunError(f"--build {name} needs --seq-len N (tokens per sequence)")
        argv = ["--model", "8b", *argv]  # the parser's required name; the model's shape comes from the build
    if "--hw" not in argv and "--hardware" not in argv:
        argv = [*argv, "--hw", "h100"]
    try:
        args, model, layout = layout_from_args(argv)
    except ValueError as exc:
        raise DryRunError(" ".join(str(exc).split())) from None
    given = {k for k, v in vars(args).items() if v not in (None, False, 0) and k in _NOT_DRY}
    if layout.schedule == "interleaved":
        given.add("virtual_stages")
    if given:
        raise DryRunError(f"{_NOT_DRY[sorted(given)[0]]}; drop it for the dry run")
    if layout.precision not in PRECISIONS:
        raise DryRunError(
            f"--precision {layout.precision}: the dry run lays out bf16 or fp32 (fp16 and fp8 need a GPU)"
        )
    if layout.zero_stage == 1:
        raise DryRunError(
            "--zero 1: the dry run lays out FSDP2 (--fsdp: ZeRO-3, --zero 2: FSDP2 without resharding after forward)"
        )
    if layout.recompute == "selective":
        raise DryRunError(
            "--recompute selective: the workbench's selective checkpointing recomputes every other block, not the "
            "planner's selective attention recompute; use --recompute full or none"
        )
    strategy = (
        "fsdp2" if layout.zero_stage == 3 else "fsdp2 reshard_after_forward=false" if layout.zero_stage == 2 else None
    )
    if strategy is None:
        strategy = "ddp" if layout.dp_replicate > 1 and layout.tp == layout.pp == 1 else "fsdp2"
    micro = (args.microbatches or layout.pp) if layout.pp > 1 else None
    boundaries = None
    if isinstance(layout.stage_layers, tuple):
        cuts = [sum(layout.stage_layers[: i + 1]) for i in range(len(layout.stage_layers) - 1)]
        boundaries = cuts
    return dry_run(
        build if build is not None else args.model,
        gpus=layout.world_size,
        tp=layout.tp,
        pp=layout.pp,
        dp_shard=layout.dp_shard,
        dp_replicate=layout.dp_replicate,
        cp=layout.cp,
        ep=layout.ep,
        strategy=strategy,
        batch=layout.micro_batch_size * (micro or 1),
        seq=model.seq_len,
        microbatches=micro,
        schedule=layout.schedule,
        precision=layout.precision,
        recompute=layout.recompute,
        hw=args.hw,
        pp_boundaries=boundaries,
    )
