"""``%distrain prepare KIND [options]`` and ``%distrain layout``: lay a model out, then look at it.

``prepare`` validates the spec in the notebook (against the world size and the
model's config, fetched from rank 0) before any rank changes, then runs
``engine.prepare`` on every rank and rebinds the ranks' ``model`` and ``optimizer``
variables to the wrapped ones.
"""
from __future__ import annotations

import re

from .. import api
from ..cluster.errors import WorkbenchError
from . import UsageError, command

_IDENT = re.compile(r"^[A-Za-z_]\w*$")


def _prepare_args(p) -> None:
    p.add_argument("spec", nargs="*", help="strategy: ddp | fsdp2 | zero | tp | pp | fsdp2_tp, then options "
                                         "(tp=2, --dtype bf16, --zero-stage 3, ...)")
    p.add_argument("--model", default="model", help="rank variable holding the model (default: model)")
    p.add_argument("--optimizer", default="optimizer",
                   help="rank variable holding an optimizer or a factory params -> optimizer")


@command("prepare", "lay the ranks' model out with a parallelism strategy", _prepare_args)
def _prepare(args, shell):
    from ..strategies import SpecError, spec_from_args

    for name in (args.model, args.optimizer):
        if not _IDENT.match(name):
            raise UsageError(f"{name!r} is not a variable name")
    argv = list(args.spec)
    if not argv:
        raise UsageError("name a strategy, e.g. `%distrain prepare fsdp2` or `%distrain prepare fsdp2_tp tp=2`")
    rs = api.current()
    try:
        spec = spec_from_args(argv)
    except (SpecError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    model_name, opt_name = args.model, args.optimizer
    probe = rs.apply(_probe_model, model_name, opt_name, ranks=[0])[0]
    if probe["missing"]:
        raise UsageError(f"no variable {' or '.join(probe['missing'])} on rank 0: build the model and "
                         f"optimizer (or a factory `lambda params: ...`) in a %%distrain cell first")
    device_type = "cuda" if str(rs.info[0].get("device", "cpu")).startswith("cuda") else "cpu"
    try:
        spec.validate(rs.world_size, probe["config"], device_type=device_type)
    except (SpecError, ValueError) as exc:
        raise WorkbenchError(f"{exc} (nothing was changed on the ranks)") from None
    rs.push({"_workbench_spec": spec})
    api.run(
        "from workbench import engine as _wb_engine\n"
        f"prepared = _wb_engine.prepare({model_name}, {opt_name}, _workbench_spec, mesh_device={device_type!r})\n"
        f"{model_name}, {opt_name} = prepared.model, prepared.optimizer\n"
        "del _workbench_spec\n"
    )
    layouts = rs.apply(_layout)
    lay = layouts[0]
    mesh = " x ".join(f"{n}={s}" for n, s in zip(lay["mesh"]["dim_names"], lay["mesh"]["shape"]))
    held = ", ".join(f"rank {l['rank']} {l['param_bytes_local'] / 2**20:.2f} MiB" for l in layouts)
    print(f"{lay['strategy']} via the {lay['path']} path on mesh {mesh}; parameter bytes held: {held} "
          f"(whole model {lay['param_bytes_global'] / 2**20:.2f} MiB)")
    for note in lay.get("notes", []):
        print(f"  note: {note}")


def _probe_model(model_name: str, opt_name: str) -> dict:
    """On rank 0: is the model there, and what config does it carry (for validation)?"""
    import __main__

    ns = vars(__main__)
    missing = [n for n in (model_name, opt_name) if n not in ns]
    config = None
    if model_name in ns:
        from workbench.strategies import model_config_of

        config = model_config_of(ns[model_name])
    return {"missing": missing, "config": config}


def _layout() -> dict:
    from workbench import engine

    return engine.prepared().layout


def _layout_args(p) -> None:
    p.add_argument("--tensor", default=None, help="draw this tensor's blocks and which ranks hold them")
    p.add_argument("--match", default=None, help="only tensors whose name matches this regex")
    p.add_argument("--max", type=int, default=24, help="at most this many tensors (largest first)")


@command("layout", "picture of which shard of which tensor lives on which rank", _layout_args)
def _show_layout(args, shell):
    from ..dashboard.layout_figure import layout_figure, tensor_figure

    layouts = api.current().apply(_layout)
    if args.tensor:
        try:
            return tensor_figure(layouts, args.tensor)
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from None
    return layout_figure(layouts, max_tensors=args.max, match=args.match)
