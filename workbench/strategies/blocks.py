"""Blocks: the unit of FSDP2 wrapping, activation checkpointing, compile and pipeline splits.

Found, in order, from an explicit ``blocks=`` (class names, module paths or a predicate),
else the model's Hugging Face ``_no_split_modules``, else the largest ``ModuleList`` /
``ModuleDict`` / ``Sequential`` of repeated modules of one class anywhere in the tree.
When none is found the caller gets a :class:`PrepareError` naming the model's largest
submodules: wrapping only the root would all-gather the whole model for every forward.
"""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import nn

from .base import PrepareError

__all__ = [
    "Blocks",
    "BlocksArg",
    "find_blocks",
    "apply_activation_checkpointing",
    "apply_compile",
    "largest_submodules",
]

BlocksArg = None | str | Sequence[str] | Callable


@dataclass(frozen=True)
class Blocks:
    """The blocks found in a model: module paths (``named_modules`` names), the modules, and
    how they were found (``"blocks="``, ``"_no_split_modules"``, ``"repeated container"``)."""

    names: tuple[str, ...]
    modules: tuple[nn.Module, ...]
    source: str
    container: str | None = None  # the ModuleList/ModuleDict holding them, when there is one

    def describe(self) -> str:
        kinds = sorted({type(m).__name__ for m in self.modules})
        where = f" in {self.container}" if self.container else ""
        return f"{len(self.names)} x {'/'.join(kinds)}{where} (from {self.source})"


def _param_count(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def largest_submodules(model: nn.Module, n: int = 5) -> list[str]:
    """``"name (Class, N params)"`` of the largest direct and nested submodules."""
    rows = [(name, m) for name, m in model.named_modules() if name]
    rows.sort(key=lambda r: -_param_count(r[1]))
    return [f"{name} ({type(m).__name__}, {_param_count(m):,} params)" for name, m in rows[:n]]


def _outermost(found: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """Drop matches nested inside another match (a block's own sub-blocks)."""
    names = [n for n, _ in found]
    return [(n, m) for n, m in found if not any(n != o and n.startswith(o + ".") for o in names if o)]


def _predicate(pred: Callable) -> Callable[[str, nn.Module], bool]:
    try:
        n_args = len(
            [
                p
                for p in inspect.signature(pred).parameters.values()
                if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
        )
    except (TypeError, ValueError):
        n_args = 1
    return (lambda name, m: bool(pred(name, m))) if n_args >= 2 else (lambda name, m: bool(pred(m)))


def _container_of(names: list[str]) -> str | None:
    parents = {n.rsplit(".", 1)[0] if "." in n else "" for n in names}
    return next(iter(parents)) or "(root)" if len(parents) == 1 else None


def _from_arg(model: nn.Module, blocks: BlocksArg) -> Blocks:
    mods = [(n, m) for n, m in model.named_modules() if n]
    if callable(blocks) and not isinstance(blocks, str):
        test = _predicate(blocks)
        found = [(n, m) for n, m in mods if test(n, m)]
        what = f"the predicate {getattr(blocks, '__name__', 'blocks')}"
    else:
        wanted = [blocks] if isinstance(blocks, str) else list(blocks)
        if not wanted or not all(isinstance(w, str) for w in wanted):
            raise PrepareError(
                f"blocks={blocks!r}: give class names, module paths (globs like 'layers.*'), "
                "or a predicate module -> bool"
            )
        found = [
            (n, m) for n, m in mods if any(type(m).__name__ == w or n == w or fnmatch.fnmatchcase(n, w) for w in wanted)
        ]
        what = f"blocks={wanted!r}"
    found = _outermost(found)
    if not found or (len(found) == 1 and found[0][1] is model):
        classes = sorted({type(m).__name__ for _, m in mods})
        raise PrepareError(
            f"{what} matches no submodule of {type(model).__name__}; its classes are "
            f"{', '.join(classes[:12])}{' ...' if len(classes) > 12 else ''} and its largest "
            f"submodules {'; '.join(largest_submodules(model))}. Pass class names (blocks=['MyBlock']), "
            "module paths (blocks=['encoder.layers.*']) or a predicate (blocks=lambda m: ...)"
        )
    names = [n for n, _ in found]
    return Blocks(tuple(names), tuple(m for _, m in found), "blocks=", _container_of(names))


def _from_no_split(model: nn.Module) -> Blocks | None:
    classes = getattr(model, "_no_split_modules", None)
    if not classes:
        return None
    classes = set(classes)
    found = _outermost([(n, m) for n, m in model.named_modules() if n and type(m).__name__ in classes])
    if not found:
        return None
    names = [n for n, _ in found]
    return Blocks(tuple(names), tuple(m for _, m in found), "_no_split_modules", _container_of(names))


def _from_containers(model: nn.Module) -> Blocks | None:
    best = None
    for name, m in model.named_modules():
        if not isinstance(m, (nn.ModuleList, nn.ModuleDict, nn.Sequential)):
            continue
        kids = list(m.named_children())
        if len(kids) < 2 or len({type(k) for _, k in kids}) != 1:
            continue
        size = sum(_param_count(k) for _, k in kids)
        if size and (best is None or size > best[0]):
            best = (size, name, kids)
    if best is None:
        return None
    _, cname, kids = best
    prefix = f"{cname}." if cname else ""
    names = [prefix + k for k, _ in kids]
    return Blocks(tuple(names), tuple(m for _, m in kids), "repeated container", cname or "(root)")


def find_blocks(model: nn.Module, blocks: BlocksArg = None, *, purpose: str = "FSDP2 wrapping") -> Blocks:
    """The model's blocks (see module doc); raise :class:`PrepareError` when none is found."""
    if blocks is not None:
        return _from_arg(model, blocks)
    found = _from_no_split(model) or _from_containers(model)
    if found is None:
        raise PrepareError(
            f"no blocks found in {type(model).__name__} for {purpose}: no blocks= was given, it has no "
            "_no_split_modules, and no ModuleList/ModuleDict/Sequential of repeated modules of one class. "
            f"Its largest submodules: {'; '.join(largest_submodules(model)) or '(none)'}. "
            "Pass blocks= to prepare: class names (blocks=['MyBlock']), module paths "
            "(blocks=['encoder', 'decoder']) or a predicate (blocks=lambda m: isinstance(m, MyBlock))"
        )
    return found


def apply_activation_checkpointing(blocks: Blocks, mode: str, notes: list[str], context_fn=None) -> None:
    """Recompute block activations in backward, keeping parameter names unchanged.

    ``full``: every block; ``selective``: every other block (torchtitan's layer-level
    selective AC). Non-reentrant ``torch.utils.checkpoint`` so it composes with FSDP2/TP.
    ``context_fn``: checkpoint's ``(forward context, recompute context)`` factory (context
    parallel marks its ring attention active while a block recomputes in backward).
    """
    if mode == "none":
        return
    from torch.utils.checkpoint import checkpoint

    every = 1 if mode == "full" else 2
    extra = {"context_fn": context_fn} if context_fn is not None else {}
    wrapped = 0
    for i, block in enumerate(blocks.modules):
        if i % every:
            continue
        inner = block.forward

        def fwd(*args, _inner=inner, **kwargs):
            return checkpoint(_inner, *args, use_reentrant=False, **extra, **kwargs)

        block.forward = fwd
        block._workbench_checkpointed = True
        wrapped += 1
    notes.append(f"activation checkpointing ({mode}): {wrapped}/{len(blocks.modules)} blocks recompute in backward")


def apply_compile(blocks: Blocks, notes: list[str], mode: str | None = None) -> None:
    """``torch.compile`` each block (repeated blocks share one compiled graph).
    ``mode="reduce-overhead"`` records each block into CUDA graphs: static shapes
    (``dynamic=False``; a new shape records a new graph), outputs reused at the next replay."""
    for b in blocks.modules:
        b.compile(mode=mode, dynamic=False if mode == "reduce-overhead" else None)
    how = " into CUDA graphs (mode='reduce-overhead', static shapes)" if mode == "reduce-overhead" else ""
    notes.append(f"torch.compile applied per block{how} ({len(blocks.modules)} blocks)")
