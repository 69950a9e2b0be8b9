"""What a checkpoint captures on a rank: model + optimizer tensors, step, data position, RNG.

Keys are the model's own parameter names at global shapes (``get_state_dict``, flattened
optimizer state), and DeepSpeed's engine is read into the same keys, so a checkpoint saved
under one strategy and world size loads under another. Everything that is not a tensor goes
to JSON, never to pickles."""

from __future__ import annotations

import base64
import random
from dataclasses import dataclass, field

import torch

__all__ = [
    "TrainState",
    "Target",
    "target_from_prepared",
    "capture",
    "capture_split",
    "split_optimizer",
    "merge_optimizer",
    "rng_state",
    "set_rng_state",
    "tensor_shapes",
]


@dataclass
class TrainState:
    """Where training is: the next step to run, last loss, and a JSON data position."""

    step: int = 0
    loss: float | None = None
    data: dict = field(default_factory=dict)


@dataclass
class Target:
    """The things a checkpoint reads from and writes into, on one rank."""

    model: torch.nn.Module  # as prepared (DDP / FSDP2 / TP module) or the DeepSpeed engine
    optimizer: object | None
    state: TrainState
    strategy: str = "none"
    spec: dict = field(default_factory=dict)
    mesh: dict = field(default_factory=dict)
    engine_state: bool | None = None  # the Prepared's capability; None: a bare model (asked of the model)

    @property
    def is_deepspeed(self) -> bool:
        """State read and written through a DeepSpeed engine's own API."""
        if self.engine_state is not None:
            return self.engine_state
        return hasattr(self.model, "zero_optimization_stage")  # a bare engine given to track(model=...)


def target_from_prepared(prepared, state: TrainState | None = None) -> Target:
    """A :class:`Target` for a ``workbench.strategies.Prepared``."""
    layout = getattr(prepared, "layout", {}) or {}
    spec = getattr(prepared, "spec", None)
    return Target(
        model=prepared.model,
        optimizer=prepared.optimizer,
        state=state or TrainState(),
        strategy=layout.get("strategy", getattr(spec, "kind", "none")),
        spec=spec.to_dict() if hasattr(spec, "to_dict") else {},
        mesh=layout.get("mesh", {}),
        engine_state=bool(getattr(prepared, "engine_state", False)),
    )


def _opts(strict: bool = True):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True, strict=strict)


def capture_split(target: Target, *, with_optimizer: bool = True) -> tuple[dict, dict, dict]:
    """(model state dict, flat optimizer state dict, frozen base) where a peft model's state dict
    is only its trainable tensors and ``frozen`` the rest (``{}`` for any other model)."""
    from .adapters import peft_model, split_trainable

    if peft_model(target.model) is None:
        return (*capture(target, with_optimizer=with_optimizer), {})
    if target.is_deepspeed:  # its engine API reads the trainable tensors only: the base would be lost
        raise NotImplementedError(
            "checkpoints of a peft model under DeepSpeed are not supported (the frozen base cannot be "
            "recorded through its engine): lay the model out with fsdp2 or ddp for LoRA checkpoints"
        )
    msd, osd = capture(target, with_optimizer=with_optimizer)
    msd, frozen = split_trainable(target.model, msd)
    return msd, osd, frozen


def capture(target: Target, *, with_optimizer: bool = True) -> tuple[dict, dict]:
    """(model state dict, flat optimizer state dict) as torch's state_dict API returns them."""
    if target.is_deepspeed:
        return _ds_capture(target, with_optimizer)
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if with_optimizer and target.optimizer is not None:
        msd, osd = get_state_dict(target.model, [target.optimizer], options=_opts())
        return msd, dict(osd)
    return get_model_state_dict(target.model, options=_opts()), {}


def apply_state(target: Target, msd: dict, osd: dict | None) -> None:
    """Write loaded state into the model (and optimizer where ``osd`` is given)."""
    if target.is_deepspeed:
        return _ds_apply(target, msd, osd)
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    from .adapters import peft_model

    opts = _opts(strict=peft_model(target.model) is None)  # a peft model's frozen base is not in msd
    if osd is not None and target.optimizer is not None:
        set_state_dict(target.model, [target.optimizer], model_state_dict=msd, optim_state_dict=osd, options=opts)
    else:
        set_model_state_dict(target.model, msd, options=opts)


def split_optimizer(osd: dict) -> tuple[dict, dict]:
    """(tensor entries, JSON-able entries) of a flat optimizer state dict."""
    tensors, values = {}, {}
    for k, v in osd.items():
        if isinstance(v, torch.Tensor):
            tensors[k] = v
        else:
            values[k] = _jsonable(k, v)
    return tensors, values


def _jsonable(key, v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(key, x) for x in v]
    raise TypeError(
        f"optimizer entry {key!r} holds a {type(v).__name__}; only numbers, strings, lists and "
        "tensors can be checkpointed without pickles"
    )


def merge_optimizer(template: dict, tensors: dict, values: dict) -> dict:
    """A full flat optimizer state dict: loaded tensors, saved values typed like the template."""
    out = dict(template)
    out.update(tensors)
    for k, v in values.items():
        if k in template:
            t = template[k]
            out[k] = tuple(v) if isinstance(t, tuple) and isinstance(v, list) else v
    return out


def tensor_shapes(sd: dict) -> dict:
    """key -> [global shape, dtype] (DTensor shapes are global)."""
    return {
        k: [list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in sd.items() if isinstance(v, torch.Tensor)
    }


# ------------------------------------------------------------------------------ RNG (JSON)
def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.contiguous().numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def rng_state() -> dict:
    """This rank's RNG states as JSON: torch CPU/CUDA, python ``random``, numpy."""
    v, st, gauss = random.getstate()
    out: dict = {"python": [v, list(st), gauss], "torch_cpu": _b64(torch.get_rng_state())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["torch_cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    try:
        import numpy as np

        s = np.random.get_state()
        out["numpy"] = [s[0], [int(x) for x in s[1]], int(s[2]), int(s[3]), float(s[4])]
    except ImportError:  # pragma: no cover
        pass
    return out


def set_rng_state(d: dict) -> None:
    if "python" in d:
        v, st, gauss = d["python"]
        random.setstate((v, tuple(st), gauss))
    if "torch_cpu" in d:
        torch.set_rng_state(_unb64(d["torch_cpu"]))
    if "torch_cuda" in d and torch.cuda.is_available():
        states = [_unb64(s) for s in d["torch_cuda"]]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)
    if "numpy" in d:
        try:
            import numpy as np

            name, key, pos, has_gauss, cached = d["numpy"]
            np.random.set_state((name, np.array(key, dtype=np.uint32), pos, has_gauss, cached))
        except ImportError:  # pragma: no cover
            pass


# ------------------------------------------------------------------------------ DeepSpeed
def _ds_named_params(engine):
    return [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad]


def _persistent_buffers(module) -> list:
    """(name, buffer) of the buffers a state_dict holds (non-persistent ones, e.g. RoPE tables, are not)."""
    out = []
    for prefix, m in module.named_modules():
        skip = getattr(m, "_non_persistent_buffers_set", set())
        for n, b in m.named_buffers(recurse=False):
            if n not in skip and b is not None:
                out.append((f"{prefix}.{n}" if prefix else n, b))
    return out


def _ds_partitioned(engine) -> bool:
    """ZeRO 1-3 keep fp32 master weights + optimizer state in flat partitions (else: plain torch)."""
    return any(hasattr(p, "_hp_mapping") or hasattr(p, "ds_id") for _, p in _ds_named_params(engine))


def _ds_torch_target(target: Target) -> Target:
    """ZeRO stage 0: the engine's optimizer is a torch optimizer over the module's parameters."""
    opt = target.model.optimizer
    opt = opt if isinstance(opt, torch.optim.Optimizer) else getattr(opt, "optimizer", None)
    return Target(model=target.model.module, optimizer=opt, state=target.state, strategy=target.strategy)


def _ds_base_optimizer(engine):
    return getattr(engine.optimizer, "optimizer", engine.optimizer)


def _ds_init_state(engine) -> None:
    """Create Adam state on the flat fp32 partitions: one zero-lr step on zero gradients (as
    torch's state_dict API does for a fresh optimizer); DeepSpeed's own gradient buffers are
    put back afterwards."""
    base = _ds_base_optimizer(engine)
    if any(base.state.values()):
        return
    flat = getattr(engine.optimizer, "fp32_partitioned_groups_flat", None)
    if flat is not None:  # ZeRO-3 steps one sub-group at a time, its params put in the group meanwhile
        for i, fp32 in enumerate(flat):
            gid = engine.optimizer.sub_group_to_group_id[i]
            saved = base.param_groups[gid]["params"]
            base.param_groups[gid]["params"] = [fp32]
            try:
                _zero_lr_step(base)
            finally:
                base.param_groups[gid]["params"] = saved
        return
    _zero_lr_step(base)


def _zero_lr_step(base) -> None:
    params = [p for g in base.param_groups for p in g["params"]]
    old = [p.grad for p in params]
    lrs = [g.get("lr") for g in base.param_groups]
    try:
        for p in params:
            p.grad = torch.zeros_like(p)
        for g in base.param_groups:
            if "lr" in g:
                g["lr"] = 0.0
        base.step()
    finally:
        for g, lr in zip(base.param_groups, lrs):
            if lr is not None:
                g["lr"] = lr
        for p, g in zip(params, old):
            p.grad = g


def _ds_capture(target: Target, with_optimizer: bool) -> tuple[dict, dict]:
    engine = target.model
    if not _ds_partitioned(engine):
        t = _ds_torch_target(target)
        return capture(t, with_optimizer=with_optimizer and t.optimizer is not None)
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    if with_optimizer:
        _ds_init_state(engine)
    msd: dict = {}
    osd: dict = {}
    named = _ds_named_params(engine)
    for name, p in named:  # collectives inside: same order on every rank
        msd[name] = safe_get_full_fp32_param(p).detach().cpu().clone()
        if with_optimizer:
            for key in ("exp_avg", "exp_avg_sq"):
                osd[f"state.{name}.{key}"] = safe_get_full_optimizer_state(p, key).detach().cpu().clone()
    for name, b in _persistent_buffers(engine.module):
        msd[name] = b.detach().cpu().clone()
    if with_optimizer:
        step = _ds_step(engine)
        group = {k: v for k, v in _ds_base_optimizer(engine).param_groups[0].items() if k != "params"}
        for name, _ in named:
            osd[f"state.{name}.step"] = torch.tensor(float(step))
            for k, v in group.items():
                if v is None or isinstance(v, (bool, int, float, str, tuple, list)):
                    osd[f"param_groups.{name}.{k}"] = v
    return msd, osd


def _ds_step(engine) -> int:
    for st in _ds_base_optimizer(engine).state.values():
        if "step" in st:
            s = st["step"]
            return int(s.item() if isinstance(s, torch.Tensor) else s)
    return 0


def _ds_apply(target: Target, msd: dict, osd: dict | None) -> None:
    engine = target.model
    if not _ds_partitioned(engine):
        return apply_state(_ds_torch_target(target), msd, osd)
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    named = _ds_named_params(engine)
    if engine.zero_optimization_stage() == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters([p for _, p in named], modifier_rank=0):
            with torch.no_grad():
                for name, p in named:
                    p.copy_(msd[name].to(p.dtype))
    else:  # stage 1/2: every rank holds the full low-precision (here: working) parameters
        with torch.no_grad():
            for name, p in named:
                p.copy_(msd[name].to(p.dtype))
    for name, p in named:  # the fp32 master partitions
        safe_set_full_fp32_param(p, msd[name].to(torch.float32))
        if osd:
            for key in ("exp_avg", "exp_avg_sq"):
                k = f"state.{name}.{key}"
                if k in osd:
                    safe_set_full_optimizer_state(p, osd[k].to(torch.float32), key)
    with torch.no_grad():
        for name, b in _persistent_buffers(engine.module):
            if name in msd:
                b.copy_(msd[name])
    if osd:
        steps = [v for k, v in osd.items() if k.startswith("state.") and k.endswith(".step")]
        if steps:
            for st in _ds_base_optimizer(engine).state.values():
                if "step" in st:
                    st["step"] = steps[0].clone() if isinstance(st["step"], torch.Tensor) else int(steps[0].item())
