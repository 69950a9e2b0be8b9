"""``%distrain prepare KIND [options]``: lay the ranks' model out with a parallelism layout.

The spec is checked on rank 0 (against the world size and the model's config) before any
rank changes; then ``engine.prepare`` runs on every rank (``rpc.Prepare``) and the ranks'
model and optimizer variables are rebound to the wrapped ones.
"""

from __future__ import annotations

import re

from ...engine import rpc
from ...shared.errors import WorkbenchError
from .. import api
from ..cluster.cell import run_cell
from . import flags
from .registry import UsageError, command

_IDENT = re.compile(r"^[A-Za-z_]\w*$")


def _prepare_args(p) -> None:
    p.add_argument(
        "spec",
        nargs="*",
        help="a preset (ddp | fsdp2 | hsdp | tp | pp | zero) and/or degrees "
        "(dp_replicate=, dp_shard=, tp=, pp=; one may be -1), then options: "
        "'fsdp2 tp=2', 'pp=2 dp_shard=2', 'zero stage=3', 'fsdp2 dtype=bf16 "
        "cpu_offload=true', 'ddp compile'",
    )
    p.unknown_hint = "strategy options go as key=value after the kind: dtype=fp16, cpu_offload=true, compile"
    p.add_argument(
        "--blocks", default=None, help="comma-separated block class names or module paths (default: found in the model)"
    )
    p.add_argument(
        "--model-var", default="model", metavar="NAME", help="the rank variable holding the model (default: model)"
    )
    p.add_argument(
        "--optimizer-var",
        default="optimizer",
        metavar="NAME",
        help="the rank variable holding the optimizer or a factory params -> optimizer (default: optimizer)",
    )
    flags.SESSION.add(p)
    p.was("--model", "--model-var", "--model is the planner's catalogue model")
    p.was("--optimizer", "--optimizer-var", "as --model-var")


@command("prepare", "lay the ranks' model out with a parallelism layout", _prepare_args)
def _prepare(args, shell):
    from ...strategies import SpecError, spec_from_args

    for name in (args.model_var, args.optimizer_var):
        if not _IDENT.match(name):
            raise UsageError(f"{name!r} is not a variable name")
    argv = list(args.spec)
    if not argv:
        raise UsageError("name a strategy, e.g. `%distrain prepare fsdp2` or `%distrain prepare fsdp2_tp tp=2`")
    rs = api.current()
    if rs.config.framework != "torch":
        raise UsageError(
            f"`%distrain prepare` lays out torch models and this rank set runs {rs.config.framework}: shard with "
            "NamedSharding there (`engine.describe_jax(params)` draws it), or start a torch set beside it "
            "with `%distrain start -n N --session NAME`"
        )
    try:
        spec = spec_from_args(argv)
    except (SpecError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    model_name, opt_name = args.model_var, args.optimizer_var
    device_type = "cuda" if str(rs.info[0].get("device", "cpu")).startswith("cuda") else "cpu"
    # Validate on rank 0 (it has the model's config; the notebook need not import torch)
    # before any rank changes: a bad spec leaves every rank exactly as it was.
    blocks = [b.strip() for b in args.blocks.split(",") if b.strip()] if args.blocks else None
    probe = rs.apply(
        rpc.handle,
        rpc.ProbeModel(
            model_name=model_name,
            opt_name=opt_name,
            spec=spec.to_dict(),
            world_size=rs.world_size,
            device_type=device_type,
            blocks=tuple(blocks) if blocks else None,
        ),
        ranks=[0],
    )[0]
    if probe.missing:
        raise UsageError(
            f"no variable {' or '.join(probe.missing)} on rank 0: build the model and "
            f"optimizer (or a factory `lambda params: ...`) in a %%distrain cell first"
        )
    if probe.error:
        raise WorkbenchError(f"{probe.error} (nothing was changed on the ranks)")
    request = rpc.Prepare(
        model_name=model_name,
        opt_name=opt_name,
        spec=spec.to_dict(),
        device_type=device_type,
        blocks=tuple(blocks) if blocks else None,
    )
    # run as a cell is (output per rank, a straggler released) and answered with the layouts
    layouts = [lay.to_dict() for lay in run_cell(rs, request).result()]
    print(layout_summary(layouts))
    return None


def layout_summary(layouts: list[dict]) -> str:
    """Strategy, path, mesh, parameter bytes per rank and the strategy's notes."""
    lay = layouts[0]
    mesh = " x ".join(f"{n}={s}" for n, s in zip(lay["mesh"]["dim_names"], lay["mesh"]["shape"]))
    held = ", ".join(f"rank {l['rank']} {l['param_bytes_local'] / 2**20:.2f} MiB" for l in layouts)
    lines = [
        f"{lay['strategy']} via the {lay['path']} path on mesh {mesh}; parameter bytes held: {held} "
        f"(whole model {lay['param_bytes_global'] / 2**20:.2f} MiB)"
    ]
    if lay.get("degrees"):
        on = [f"{n}={v}" for n, v in lay["degrees"].items() if v > 1]
        lines.append(f"  degrees: {' x '.join(on) or 'one rank'}")
    if lay.get("blocks"):
        names = lay["blocks"]
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
        lines.append(f"  blocks (rank 0): {shown}")
    lines += [f"  note: {note}" for note in lay.get("notes", [])]
    return "\n".join(lines)
