"""Command-line style arguments for `%distrain plan ...` -> a `Plan`.

Kept separate from the magic so that the magic stays thin (parse, call, print) and the
parser is testable without IPython. Any bad argument raises ValueError with one line:
what is wrong, then the usage.
"""

from __future__ import annotations

import argparse
import shlex

from ..shared.argtypes import non_negative_float, positive_float, positive_int
from .layout import ATTENTIONS, PRECISIONS, RECOMPUTE, SCHEDULES, PlanLayout
from .model_spec import ModelSpec
from .recommend import default_global_batch
from .report import Plan, plan

USAGE = (
    "usage: %distrain plan --model 70b --hw h100 [--gpus N] [--tp N] [--pp N] [--dp N] "
    "[--zero 0-3] [--cp N] [--ep N] [--microbatches M] [--mbs B] "
    "[--schedule 1f1b|gpipe|interleaved] [--virtual-stages V] "
    "[--stages balanced|7,8*14,7] [--precision bf16|fp32|fp16|fp8] [--fp8] "
    "[--attention flash|eager] [--recompute none|selective|full] [--offload] "
    "[--no-sp] [--seq-len S] [--tokens 1e12] [--price USD/h] [--lora R]"
)


def _stages(text: str) -> tuple[int, ...] | str:
    """'balanced', or counts per stage: '7,8*14,7' (N*K repeats N, K times)."""
    if text == "balanced":
        return text
    counts: list[int] = []
    try:
        for part in text.split(","):
            value, _, times = part.strip().partition("*")
            counts += [int(value)] * (int(times) if times else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'balanced' or layer counts like 7,8*14,7, got {text!r}") from None
    return tuple(counts)


class _Parser(argparse.ArgumentParser):
    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        # the spelling docs/grammar.md lists it under (its first long name), as the magics' parsers tag theirs
        action.grammar = next((o for o in action.option_strings if o.startswith("--")), action.dest)
        return action

    def error(self, message: str):  # argparse would print and sys.exit
        raise ValueError(f"{message}. {USAGE}")


def _parser() -> _Parser:
    p = _Parser(prog="%distrain plan", add_help=False, allow_abbrev=False)
    p.add_argument("--model", required=True)
    p.add_argument("--hw", "--hardware", dest="hw", required=True)
    p.add_argument("--gpus", type=positive_int)
    p.add_argument("--tp", type=positive_int, default=1)
    p.add_argument("--pp", type=positive_int, default=1)
    p.add_argument("--dp", type=positive_int, help="dp_shard if --zero > 0 else dp_replicate")
    p.add_argument("--dp-replicate", type=positive_int)
    p.add_argument("--dp-shard", type=positive_int)
    p.add_argument("--zero", type=int, default=0, choices=range(4))
    p.add_argument("--fsdp", action="store_true", help="same as --zero 3")
    p.add_argument("--cp", type=positive_int, default=1)
    p.add_argument("--ep", type=positive_int, default=1)
    p.add_argument("--microbatches", "-m", type=positive_int, default=None)
    p.add_argument("--mbs", type=positive_int, default=1)
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    p.add_argument("--virtual-stages", type=positive_int, default=None)
    p.add_argument("--precision", choices=PRECISIONS, default=None)
    p.add_argument("--fp8", action="store_true", help="same as --precision fp8")
    p.add_argument("--attention", choices=ATTENTIONS, default="flash")
    p.add_argument("--stages", "--layers-per-stage", dest="stages", type=_stages, default=None)
    p.add_argument("--recompute", choices=RECOMPUTE, default="none")
    p.add_argument("--offload", action="store_true")
    p.add_argument("--nvme", type=positive_float, default=None, help="offload to NVMe at this GB/s per device")
    p.add_argument("--no-sp", action="store_true")
    p.add_argument("--seq-len", type=positive_int)
    p.add_argument("--tokens", type=positive_float)
    p.add_argument("--price", type=non_negative_float)
    p.add_argument("--lora", type=positive_int, default=0, help="LoRA rank: the base frozen, adapters train")
    return p


def layout_from_args(argv: list[str] | str) -> tuple[argparse.Namespace, ModelSpec, PlanLayout]:
    """Parse magic arguments into (the parsed flags, the model, the layout), each checked.

    --dp fills dp_shard when ZeRO is on and dp_replicate otherwise; if neither --dp
    nor --dp-* is given and --gpus is, dp is what --gpus leaves after tp*pp*cp.
    Microbatches default to what a ~4M-token global batch leaves per data-parallel
    rank (as `recommend` assumes), rounded up to a multiple of pp.
    """
    if isinstance(argv, str):
        argv = shlex.split(argv)
    args = _parser().parse_args(list(argv))
    zero = 3 if args.fsdp else args.zero
    try:
        if args.fp8 and args.precision not in (None, "fp8"):
            raise ValueError(f"--fp8 and --precision {args.precision} disagree; give one")
        precision = "fp8" if args.fp8 else (args.precision or "bf16")
        if args.stages is not None and args.pp == 1:
            raise ValueError("--stages says how layers split over pipeline stages; give --pp N (N >= 2) with it")
        model = ModelSpec.preset(args.model, seq_len=args.seq_len)
        rep, shard = args.dp_replicate or 1, args.dp_shard or 1
        if args.dp is not None:
            if args.dp_replicate or args.dp_shard:
                raise ValueError("give --dp or --dp-replicate/--dp-shard, not both")
            rep, shard = (1, args.dp) if zero else (args.dp, 1)
        elif args.gpus and not (args.dp_replicate or args.dp_shard):
            inner = args.tp * args.pp * args.cp
            if args.gpus % inner:
                raise ValueError(f"--gpus {args.gpus} is not divisible by tp*pp*cp={inner}")
            dp = args.gpus // inner
            rep, shard = (1, dp) if zero else (dp, 1)
        virtual = args.virtual_stages or (2 if args.schedule == "interleaved" else 1)
        micro = args.microbatches or _default_microbatches(model, rep * shard, args)
        layout = PlanLayout(
            dp_replicate=rep,
            dp_shard=shard,
            zero_stage=zero,
            tp=args.tp,
            pp=args.pp,
            cp=args.cp,
            ep=args.ep,
            microbatches=micro,
            schedule=args.schedule,
            virtual_stages=virtual,
            precision=precision,
            recompute=args.recompute,
            optimizer_offload=args.offload or args.nvme is not None,
            nvme_gbs=args.nvme or 0.0,
            micro_batch_size=args.mbs,
            seq_parallel=not args.no_sp,
            attention=args.attention,
            stage_layers=args.stages,
            lora_rank=args.lora,
        )
        if args.gpus and layout.world_size != args.gpus:
            raise ValueError(f"--gpus {args.gpus} but the layout uses pp*dp*cp*tp = {layout.world_size}")
        return args, model, layout
    except ValueError as err:
        raise ValueError(f"{err}. {USAGE}") from None


def plan_from_args(argv: list[str] | str) -> Plan:
    """Parse magic arguments (a list, or one string split like a shell) into a Plan
    (:func:`layout_from_args` says how the flags become a layout)."""
    args, model, layout = layout_from_args(argv)
    try:
        return plan(model, layout, args.hw, tokens=args.tokens, price=args.price)
    except ValueError as err:
        raise ValueError(f"{err}. {USAGE}") from None


def _default_microbatches(model: ModelSpec, dp: int, args: argparse.Namespace) -> int:
    sequences = default_global_batch(model, 1)
    micro = max(1, -(-sequences // (dp * args.mbs)))
    return -(-micro // args.pp) * args.pp
