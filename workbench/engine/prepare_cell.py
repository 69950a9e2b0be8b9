"""``%distrain prepare`` on a rank: the probe on rank 0 before any rank changes, then the
layout applied to the model and optimizer in the rank's namespace (``rpc.ProbeModel``, ``rpc.Prepare``)."""

from __future__ import annotations


def probe(model_name, opt_name, spec, world_size, device_type, blocks) -> tuple[list[str], str | None]:
    """(variables missing, the layout's own one-line refusal or None): does the spec fit the world
    and the model (degrees, blocks, tensor-parallel plan, pipeline split)?"""
    import __main__

    from ..strategies import ModelHints, PrepareError, SpecError, StrategySpec, check_layout, model_config_of

    ns = vars(__main__)
    missing = [n for n in (model_name, opt_name) if n not in ns]
    if missing:
        return missing, None
    model = ns[model_name]
    already = getattr(model, "_workbench_prepared", None)
    if already:
        return [], (
            f"{model_name!r} was already prepared with {already!r} (its parameters were changed "
            "in place); build a fresh model (same seed) on the ranks for a new strategy"
        )
    try:
        s = StrategySpec.from_dict(spec).validate(world_size, model_config_of(model), device_type=device_type)
        if s.kind not in ("none", "zero"):
            check_layout(model, s, world_size, ModelHints(blocks=list(blocks) if blocks is not None else None))
    except (SpecError, PrepareError, ValueError) as exc:
        return [], str(exc)
    return [], None


def prepare_in_namespace(model_name, opt_name, spec, device_type, blocks) -> dict | None:
    """Lay the namespace's model and optimizer out, rebind them and ``prepared``; the new layout.
    A failure is shown as a cell's traceback (kept for ``%distrain debug``) and nothing is rebound."""
    from IPython import get_ipython

    from ..strategies import StrategySpec
    from .session import current_layout, prepare

    shell = get_ipython()
    ns = shell.user_ns
    try:
        prepared = prepare(
            ns[model_name],
            ns[opt_name],
            StrategySpec.from_dict(spec),
            mesh_device=device_type,
            blocks=list(blocks) if blocks is not None else None,
        )
    except (Exception, KeyboardInterrupt):
        shell.showtraceback()
        return None
    ns["prepared"] = prepared
    ns[model_name], ns[opt_name] = prepared.model, prepared.optimizer
    return current_layout()
