"""Hugging Face weights into a model already laid out on the ranks (rank side; no hub access).

:func:`load_pretrained` reads a local ``save_pretrained`` folder through safetensors' lazy
slices, each rank only what it holds, with no collective: a rank that refuses cannot leave
the others waiting, and every missing or mis-shaped tensor is named before anything is
written. :func:`model_config` is what a checkpoint keeps so that ``export_hf`` can write a
folder ``from_pretrained`` loads."""

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
    if hasattr(inner, "peft_config") and hasattr(inner, "get_base_model"):  # a peft model: its base's config
        inner = inner.get_base_model()
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


# transformers 5 keeps a MoE layer's experts stacked (``experts.gate_up_proj [E, 2I, H]``,
# ``experts.down_proj [E, H, I]``) but save_pretrained writes them one expert at a time
# (``experts.{e}.gate_proj.weight``...), as its conversion mapping for the Qwen2-MoE family does.
_EXPERT_PARTS = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",), "up_proj": ("up_proj",)}


def _per_expert(missing: list, keys: set, prefix: str, params: dict) -> tuple[dict, list]:
    """For stacked expert weights the folder keeps per expert: name -> [[keys of expert e] for e]."""
    found, still = {}, []
    for n in missing:
        head, _, last = n.rpartition(".")
        if not head.endswith("experts") or last not in _EXPERT_PARTS or params[n].dim() < 2:
            still.append(n)
            continue
        lists = []
        for e in range(params[n].shape[0]):
            parts = [f"{head}.{e}.{part}.weight" for part in _EXPERT_PARTS[last]]
            hit = next(
                (
                    c
                    for c in (
                        parts,
                        [k[len(prefix) + 1 :] for k in parts] if prefix and n.startswith(prefix + ".") else None,
                        [f"{prefix}.{k}" for k in parts] if prefix else None,
                    )
                    if c is not None and all(k in keys for k in c)
                ),
                None,
            )
            if hit is None:
                break
            lists.append(hit)
        else:
            found[n] = lists
            continue
        still.append(n)
    return found, still


def _expert_rows(t) -> list[int] | None:
    """The experts (dim-0 indices) this rank's part of ``t`` covers, whole in every other dim; else None."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return list(range(t.shape[0]))
    from workbench.strategies.layout import _dtensor_indices

    index = _dtensor_indices(t)
    if any(len(i) != s for i, s in zip(index[1:], t.shape[1:])):
        return None
    return [int(i) for i in index[0]]


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


def hf_base_name(name: str) -> str:
    """A peft model's name of a base tensor as the base model saves it
    (``base_model.model.x.q_proj.base_layer.weight`` -> ``x.q_proj.weight``)."""
    if name.startswith("base_model.model."):
        name = name[len("base_model.model.") :]
    return name.replace(".base_layer.", ".")


def _peft_base(peft, params: dict) -> dict:
    """A peft model's frozen base tensors under the base model's own names (its adapters, which
    a base folder does not hold, left out): what a ``save_pretrained`` folder of the base fills."""
    trainable = {_clean(n) for n, p in peft.named_parameters() if p.requires_grad}
    return {hf_base_name(n): t for n, t in params.items() if n not in trainable}


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
    inner = _inner(model)
    if hasattr(inner, "peft_config") and hasattr(inner, "get_base_model"):
        params, inner = _peft_base(inner, params), inner.get_base_model()
    prefix = getattr(inner, "base_model_prefix", "") or ""
    found, missing = _match(list(params), set(where), prefix)
    stacked, missing = _per_expert(missing, set(where), prefix, params)
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
        for n, lists in stacked.items():
            each = [tuple(sl(k).get_shape()) for k in lists[0]]
            got = (len(lists), sum(s[0] for s in each), *each[0][1:])
            if len({s[1:] for s in each}) > 1 or got != tuple(params[n].shape):
                shapes.append(
                    f"{n}: {len(lists)} experts of {each} in the folder, {tuple(params[n].shape)} in the model"
                )
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
        for n, lists in stacked.items():  # one expert at a time: only the experts this rank holds
            t = params[n]
            local = t.to_local() if isinstance(t, DTensor) else t
            rows = _expert_rows(t)
            pick = lists if rows is None else [lists[e] for e in rows]
            data = torch.stack([torch.cat([handle(k).get_tensor(k) for k in ks]) for ks in pick]) if pick else None
            read += data.numel() * data.element_size() if data is not None else 0
            if rows is None:  # not whole experts here: cut the stacked tensor locally (no communication)
                data = distribute_tensor(
                    data.to(local.device, t.dtype), t.device_mesh, t.placements, src_data_rank=None
                ).to_local()
            if data is not None:
                local.copy_(data.to(local.dtype).reshape(local.shape))
    finally:
        handles.clear()
    used = set(found.values()) | {k for lists in stacked.values() for ks in lists for k in ks}
    local_bytes = sum((p.to_local() if isinstance(p, DTensor) else p).nbytes for p in params.values())
    return {
        "rank": rank,
        "tensors": len(found) + len(stacked),
        "bytes_read": read,
        "bytes_held": local_bytes,
        "unexpected": sorted(k for k in where if k not in used),
    }
