"""The Strategy Protocol, its name registry, and ``Prepared`` (what ``prepare`` returns).

Lightning Fabric's shape: a strategy is a small object with ``kind`` and ``apply``; the
registry maps ``StrategySpec.kind`` to it. What a strategy can do is part of the
``Prepared`` contract, declared by its class (``own_train_step``, ``reduce_scatter``,
``engine_state``, ``no_sync()``), so the trainer and checkpoints never guess it from names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from .spec import SpecError, StrategySpec

__all__ = [
    "Strategy",
    "register",
    "get_strategy",
    "registered",
    "Prepared",
    "Context",
    "ModelHints",
    "PrepareError",
    "lm_loss",
    "build_optimizer",
    "factory_from_optimizer",
    "check_optimizer_matches",
    "TORCH_DTYPES",
    "move_to",
]

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
OptimizerFactory = Callable[[Any], torch.optim.Optimizer]


class PrepareError(RuntimeError):
    """Preparing or stepping a strategy went wrong; the message says what to do."""


@dataclass(frozen=True)
class ModelHints:
    """What the user tells prepare about their model: ``blocks=`` (class names, module paths
    or a predicate), ``tp_plan=`` (module patterns -> styles), ``pp_boundaries=`` (block
    indices where stages 1.. start)."""

    blocks: Any = None
    tp_plan: dict | None = None
    pp_boundaries: tuple[int, ...] | None = None


@dataclass
class Context:
    """What a strategy gets besides the model: resolved spec and where it runs."""

    spec: StrategySpec  # resolved (every size explicit)
    rank: int
    world_size: int
    device: torch.device
    mesh_device: str
    loss_fn: Callable
    notes: list[str] = field(default_factory=list)
    hints: ModelHints = field(default_factory=ModelHints)


@runtime_checkable
class Strategy(Protocol):
    kind: str

    def apply(
        self, model: nn.Module, optimizer: OptimizerFactory | torch.optim.Optimizer, ctx: Context
    ) -> Prepared: ...


_REGISTRY: dict[str, Strategy] = {}


def register(strategy_cls):
    """Class decorator: ``@register`` on a class with a ``kind`` attribute."""
    _REGISTRY[strategy_cls.kind] = strategy_cls()
    return strategy_cls


def get_strategy(kind: str) -> Strategy:
    if kind not in _REGISTRY:
        raise SpecError(f"no strategy registered for kind={kind!r}; registered: {sorted(_REGISTRY)}")
    return _REGISTRY[kind]


def registered() -> list[str]:
    return sorted(_REGISTRY)


# ---------------------------------------------------------------------------- helpers
def move_to(model: nn.Module, device: torch.device) -> None:
    """``model.to(device)`` where some parameter or buffer is elsewhere. A model already there
    is left as it is: its tensors may be ones ``to`` cannot swap (a dry run's fake tensors)."""
    tensors = [*model.parameters(), *model.buffers()]
    if any(t.device != device for t in tensors):
        model.to(device)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy (positions with target -100 are ignored). Accepts a
    model output with ``.logits`` (transformers) as well as the logits tensor."""
    logits = getattr(logits, "logits", logits)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100)


def factory_from_optimizer(optimizer: torch.optim.Optimizer) -> OptimizerFactory:
    """A factory re-creating ``optimizer``'s class with its constructor defaults."""
    import inspect

    if any(optimizer.state.values()):
        raise PrepareError(
            "the optimizer passed to prepare() already has state, but sharding replaces the "
            "model's parameters; pass a factory instead, e.g. "
            "prepare(model, lambda params: torch.optim.AdamW(params, lr=1e-3), spec)"
        )
    cls = type(optimizer)
    accepted = inspect.signature(cls.__init__).parameters
    kwargs = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    return lambda params: cls(params, **kwargs)


def build_optimizer(model: nn.Module, optimizer, notes: list[str]) -> torch.optim.Optimizer:
    """Create the optimizer over the model's CURRENT (post-sharding) parameters.

    A factory is called with ``model.parameters()``. An optimizer instance that has not
    stepped is rebuilt from its class and defaults (its tensors may be the pre-sharding
    ones); one that already holds state is refused.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if isinstance(optimizer, torch.optim.Optimizer):
        factory = factory_from_optimizer(optimizer)
        notes.append(f"optimizer {type(optimizer).__name__} rebuilt from its defaults over the sharded parameters")
        return factory(params)
    if callable(optimizer):
        return optimizer(params)
    raise PrepareError(
        f"optimizer must be a torch.optim.Optimizer or a factory params -> optimizer, got {type(optimizer).__name__}"
    )


def check_optimizer_matches(model: nn.Module, optimizer: torch.optim.Optimizer, *, where: str = "") -> None:
    """Raise if the optimizer does not hold exactly the model's current parameters.

    This catches the FSDP2 trap: a forward under ``torch.no_grad()`` before the optimizer
    is created leaves the root module's parameters unsharded, and an optimizer built then
    holds plain tensors that training never updates (loss 3.07 instead of 1.54).
    """
    from torch.distributed.tensor import DTensor

    model_ids = {id(p) for p in model.parameters()}
    opt_params = [p for g in optimizer.param_groups for p in g["params"]]
    stray = [p for p in opt_params if id(p) not in model_ids]
    if stray:
        sharded = any(isinstance(p, DTensor) for p in model.parameters())
        kinds = "plain tensors" if not any(isinstance(p, DTensor) for p in stray) else "tensors"
        raise PrepareError(
            f"{where}the optimizer holds {len(stray)} {kinds} that are not the model's current "
            f"parameters{' (the model is sharded: its parameters are DTensors)' if sharded else ''}. "
            "This happens when an optimizer is created before sharding, or (FSDP2) after a forward "
            "under torch.no_grad() left the root unsharded. Create the optimizer through "
            "prepare(model, lambda params: Opt(params, ...), spec), or call model.reshard() before "
            "building it."
        )


def all_reduce_mean(value: torch.Tensor, group) -> torch.Tensor:
    import torch.distributed as dist

    if group is None or dist.get_world_size(group) == 1:
        return value
    t = value.detach().clone().float()
    dist.all_reduce(t, group=group)  # gloo has no AVG: sum, then divide
    return t / dist.get_world_size(group)


# ---------------------------------------------------------------------------- Prepared
def over_every_rank(ctx: Context) -> dict:
    """:class:`Prepared`'s arguments for a wrapper whose one data-parallel group is every rank
    (DeepSpeed, Accelerate): the loss is averaged over the world, each rank its own data share."""
    import torch.distributed as dist

    return {
        "spec": ctx.spec,
        "ctx": ctx,
        "loss_group": dist.group.WORLD,
        "dp_rank": ctx.rank,
        "dp_size": ctx.world_size,
    }


class Prepared:
    """A model and optimizer ready to train under one strategy.

    ``train_step((x, y))`` runs forward, backward and the optimizer step on this rank's
    share of the batch and returns the loss averaged over the data-parallel ranks (so it
    equals the single-rank loss of the global batch).

    Capabilities, declared by each subclass:
    ``own_train_step``: ``train_step`` runs forward, backward and optimizer itself (pipeline
    schedules, DeepSpeed, Accelerate), so the trainer times it as one phase;
    ``reduce_scatter``: gradients are reduce-scattered over the data-parallel ranks (FSDP2);
    ``engine_state``: model and optimizer state are read and written through an engine's
    own API (DeepSpeed); ``shards_sequence``: ``loss(batch)`` shards each batch's sequence
    over a context-parallel group, inside the trainer's own step;
    :meth:`no_sync`: skip gradient sync for an accumulation micro-batch.
    """

    own_train_step: ClassVar[bool] = False
    reduce_scatter: bool = False
    engine_state: ClassVar[bool] = False
    shards_sequence: ClassVar[bool] = False

    def __init__(
        self,
        *,
        model: nn.Module,
        optimizer,
        layout: dict,
        spec: StrategySpec,
        ctx: Context,
        mesh=None,
        loss_group=None,
        dp_rank: int = 0,
        dp_size: int = 1,
        inner: nn.Module | None = None,
        autocast_dtype: torch.dtype | None = None,
    ):
        self.model = model
        self.optimizer = optimizer
        self.layout = layout
        self.spec = spec
        self.mesh = mesh
        self.loss_group = loss_group
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.device = ctx.device
        self.loss_fn = ctx.loss_fn
        self._inner = inner if inner is not None else model
        self._autocast = autocast_dtype
        self.steps = 0

    @property
    def path(self) -> str:
        return self.layout["path"]

    def unwrap(self) -> nn.Module:
        """The user's module (DDP/engine wrappers removed; parameters may still be sharded)."""
        return self._inner

    def _autocast_ctx(self):
        if self._autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self._autocast)

    def set_optimizer(self, optimizer) -> torch.optim.Optimizer:
        """Replace the optimizer (a factory or an un-stepped instance), built over the
        model's current sharded parameters."""
        self.reshard()
        notes: list[str] = []
        self.optimizer = build_optimizer(self.model, optimizer, notes)
        self.check()
        return self.optimizer

    def reshard(self) -> None:
        """Return parameters to their sharded form (FSDP2 overrides; no-op elsewhere)."""

    def check(self) -> None:
        """Guard run before every step (FSDP2 re-shards a root left unsharded here)."""
        check_optimizer_matches(self.model, self.optimizer, where=f"rank {self.layout['rank']}: ")

    def compute_loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = self.loss_fn(out, y)
        aux_fn = getattr(self._inner, "aux_loss", None)
        aux = aux_fn() if callable(aux_fn) else None
        return loss if aux is None else loss + aux

    def begin_forward(self) -> None:
        """Before each forward: with CUDA graphs, tell torch's cudagraph trees a new step
        begins, so replaying over the last step's outputs (an accumulation micro-batch, a
        forward with no backward) is allowed; the trainer reads its loss before then."""
        if self.spec.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()

    def train_step(self, batch) -> float:
        self.check()
        x, y = (t.to(self.device) for t in batch)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        self.begin_forward()
        with self._autocast_ctx():
            out = self.model(x)
        loss = self.compute_loss(out, y)
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        return float(all_reduce_mean(loss.detach(), self.loss_group))

    def no_sync(self):
        """A context in which backward does not sync gradients (DDP's ``no_sync``; nothing to
        skip for strategies without data-parallel gradient sync)."""
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(self.model, DistributedDataParallel):
            return self.model.no_sync()
        return contextlib.nullcontext()

    def close(self) -> None:
        """Release process-wide state this strategy holds (overrides call this too): the
        model is done with, so its process groups go at the next prepare of another layout."""
        from .meshes import forget_user

        forget_user(self)

    def __repr__(self) -> str:
        m = self.layout["mesh"]
        return (
            f"Prepared({self.layout['strategy']} via {self.path}, mesh {m['dim_names']}={m['shape']}, "
            f"rank {self.layout['rank']}/{self.layout['world_size']}, "
            f"{self.layout['param_bytes_local']}/{self.layout['param_bytes_global']} param bytes local/global)"
        )
