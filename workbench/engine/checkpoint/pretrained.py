"""Hugging Face weights into a model already laid out on the ranks (rank side; no hub access).

:func:`load_pretrained` reads a local ``save_pretrained`` folder (``model.safetensors``, or
the shards named by ``model.safetensors.index.json``) into the model as it is now: each
rank reads, through safetensors' lazy slices, only what it holds. A DTensor parameter
(FSDP2, TP) gets its local slice of the global tensor (the box of global indices its
placements give it); a parameter whose placement is not a box (FSDP2 over TP's strided
shards) is read whole and cut up locally (``distribute_tensor(..., src_data_rank=None)``,
no communication). A plain one (DDP, no strategy) is read whole. No collective runs, so
a rank that refuses cannot leave the others waiting.

Names: the model's own parameter names (wrappers' ``_checkpoint_wrapped_module.``,
``_orig_mod.``, DDP's ``module.`` removed), matched to the file's keys as they are, or
with the model's ``base_model_prefix`` added or removed (a ``LlamaModel`` from a
``LlamaForCausalLM`` folder and back). Every missing or mis-shaped tensor is named before
anything is written: the model is left as it was.

:func:`model_config` is what a checkpoint keeps of a ``transformers`` model so that
:func:`workbench.engine.checkpoint.export.export_hf` can write a folder ``from_pretrained`` loads.
"""

from __future__ import annotations

import json
import os

import torch

__all__ = ["load_pretrained", "model_config", "own_names", "PretrainedMismatch"]

_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


class PretrainedMismatch(ValueError):
    """The folder's tensors do not fit the model (names or shapes); nothing was loaded."""


def _inner(model):
    """The user's module under DDP / DeepSpeed / ``Prepared`` wrappers."""
    if hasattr(model, "unwrap") and callable(model.unwrap) and hasattr(model, "layout"):
        return model.unwrap()
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


def _clean(name: str) -> str:
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def own_names(model) -> dict:
    """name -> tensor of the parameters and persistent buffers (tied ones once), wrapper-free names."""
    inner = _inner(model)
    out = {_clean(n): p for n, p in inner.named_parameters()}
    for prefix, m in inner.named_modules():
        skip = getattr(m, "_non_persistent_buffers_set", set())
        for n, b in m.named_buffers(recurse=False):
            if b is not None and n not in skip:
                out[_clean(f"{prefix}.{n}" if prefix else n)] = b
    return out


def model_config(model) -> dict:
    """A ``transformers`` model's config as ``config.json`` holds it (with ``architectures``);
    ``{}`` for any other model."""
    inner = _inner(model)
    config = getattr(inner, "config", None)
    if config is None or not hasattr(config, "to_json_string") or not hasattr(config, "model_type"):
        return {}
    d = json.loads(config.to_json_string(use_diff=False))
    # FSDP2 swaps the class for a dynamic ``FSDP<Name>`` subclass: name the model's own class
    cls = next((c for c in type(inner).__mro__ if not c.__module__.startswith("torch.")), type(inner))
    d["architectures"] = [cls.__name__]
    return d


def _index(folder: str) -> dict[str, str]:
    """key -> the .safetensors file of ``folder`` holding it."""
    folder = os.path.abspath(os.path.expanduser(folder))
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            f"{folder} is not a folder: give the folder save_pretrained wrote (with config.json and model.safetensors)"
        )
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as fh:
            return {k: os.path.join(folder, f) for k, f in json.load(fh)["weight_map"].items()}
    single = os.path.join(folder, "model.safetensors")
    if os.path.exists(single):
        from safetensors import safe_open

        with safe_open(single, "pt") as f:
            return {k: single for k in f.keys()}
    present = sorted(os.listdir(folder))[:10]
    raise FileNotFoundError(
        f"{folder} has no model.safetensors (or its index); it holds {present}. Only "
        "safetensors are read (never pickles): save with save_pretrained(..., "
        "safe_serialization=True)"
    )


def _match(names, keys: set, prefix: str) -> tuple[dict, list]:
    found, missing = {}, []
    for n in names:
        for k in (
            n,
            n[len(prefix) + 1 :] if prefix and n.startswith(prefix + ".") else None,
            f"{prefix}.{n}" if prefix else None,
        ):
            if k is not None and k in keys:
                found[n] = k
                break
        else:
            missing.append(n)
    return found, missing


def _box(t):
    """(slices, local shape) of the global tensor ``t``'s local part where that is a box, else None."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not isinstance(t, DTensor):
        return tuple(slice(0, s) for s in t.shape), tuple(t.shape)
    if any(type(p) not in (Shard, Replicate) for p in t.placements):
        return None
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    if tuple(shape) != tuple(t.to_local().shape):
        return None
    return tuple(slice(o, o + s) for o, s in zip(offset, shape)), tuple(shape)


@torch.no_grad()
def load_pretrained(folder: str, model) -> dict:
    """Copy the weights of a local ``save_pretrained`` folder into ``model`` as it is laid out.

    ``model``: a module (sharded or not) or a ``Prepared`` (``engine.load_pretrained``
    defaults to this rank's current one). Returns what was read: tensors, bytes read
    here, bytes held here, keys the model does not use.
    """
    import torch.distributed as dist
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor, distribute_tensor

    if hasattr(model, "reshard") and hasattr(model, "layout"):
        model.reshard()  # FSDP2: parameters back to their shards before writing into them
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    where = _index(folder)
    params = own_names(model)
    prefix = getattr(_inner(model), "base_model_prefix", "") or ""
    found, missing = _match(list(params), set(where), prefix)
    handles: dict = {}
    try:

        def handle(key):
            path = where[key]
            if path not in handles:
                handles[path] = safe_open(path, "pt")
            return handles[path]

        def sl(key):
            return handle(key).get_slice(key)

        shapes = []
        for n, k in found.items():
            got = tuple(sl(k).get_shape())
            if got != tuple(params[n].shape):
                shapes.append(f"{n}: {got} in the folder, {tuple(params[n].shape)} in the model")
        if missing or shapes:
            parts = []
            if missing:
                parts.append(
                    f"{len(missing)} tensors of the model are not in the folder: {', '.join(missing[:8])}"
                    + (" ..." if len(missing) > 8 else "")
                )
            if shapes:
                parts.append(f"{len(shapes)} have other shapes: {'; '.join(shapes[:6])}")
            raise PretrainedMismatch(
                f"rank {rank}: {folder} does not fit this model ({'; '.join(parts)}); nothing "
                "was loaded. Build the model from the folder's config.json "
                "(AutoConfig.from_pretrained(folder)) before laying it out"
            )
        read = 0
        for n, k in found.items():
            t = params[n]
            box = _box(t)
            local = t.to_local() if isinstance(t, DTensor) else t
            if box is not None and not box[0]:  # a 0-d tensor
                data = handle(k).get_tensor(k)
            elif box is not None:
                data = sl(k)[box[0]]
            else:  # not a box of the global tensor: read it whole, cut locally (no communication)
                full = sl(k)[:]
                data = distribute_tensor(
                    full.to(local.device, t.dtype), t.device_mesh, t.placements, src_data_rank=None
                ).to_local()
            read += data.numel() * data.element_size()
            local.copy_(data.to(local.dtype).reshape(local.shape))
    finally:
        handles.clear()
    used = set(found.values())
    local_bytes = sum((p.to_local() if isinstance(p, DTensor) else p).nbytes for p in params.values())
    return {
        "rank": rank,
        "tensors": len(found),
        "bytes_read": read,
        "bytes_held": local_bytes,
        "unexpected": sorted(k for k in where if k not in used),
    }
