"""Adapter (peft LoRA) checkpoints: the trainable tensors saved every time, the frozen base once.

A peft model's state dict is mostly its frozen base, so a checkpoint holds only what trains
and its optimizer state; the base is written once per root (``ROOT/bases/<fingerprint>/``,
a folder ``from_pretrained`` loads) and named by a fingerprint that is the same under any
layout or world size, so a restore can refuse a different base (docs/finetune.md)."""

from __future__ import annotations

import enum
import hashlib
import json
import os
import shutil

import torch

from .pretrained import _clean, _inner, hf_base_name, model_config

__all__ = [
    "peft_model",
    "adapter_record",
    "split_trainable",
    "base_fingerprint",
    "ensure_base",
    "check_base",
    "hf_base_name",
    "BASES",
]

BASES = "bases"  # under a checkpoint root: one folder per frozen base, named by its fingerprint
_FP_CACHE: dict[int, tuple[tuple, dict]] = {}  # id(model) -> (frozen tensors' versions, record)


def peft_model(model):
    """The ``peft.PeftModel`` under the strategy's wrappers, or None."""
    inner = _inner(model)
    return inner if hasattr(inner, "peft_config") and hasattr(inner, "get_base_model") else None


def _jsonable(v):
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, (set, frozenset)):
        return sorted(_jsonable(x) for x in v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)


def adapter_record(model) -> dict:
    """What the manifest keeps of a peft model's adapter: its name and peft config (JSON)."""
    peft = peft_model(model)
    if peft is None:
        return {}
    name = peft.active_adapter if isinstance(peft.active_adapter, str) else peft.active_adapters[0]
    return {"name": name, "config": _jsonable(peft.peft_config[name].to_dict())}


def _trainable(model) -> set[str]:
    return {_clean(n) for n, p in _inner(model).named_parameters() if p.requires_grad}


def split_trainable(model, msd: dict) -> tuple[dict, dict]:
    """(trainable, frozen) parts of a model state dict (buffers count as frozen)."""
    keep = _trainable(model)
    return {k: v for k, v in msd.items() if k in keep}, {k: v for k, v in msd.items() if k not in keep}


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _full(t: torch.Tensor, *, own: bool = False) -> torch.Tensor:
    """The whole tensor on CPU (a DTensor gathered: collective over its mesh); ``own``: storage of its
    own (safetensors refuses tensors sharing storage, as tied embeddings do)."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return t.full_tensor().detach().cpu().contiguous()
    t = t.detach().cpu().contiguous()
    return t.clone() if own else t


def _versions(frozen: dict) -> tuple:
    from torch.distributed.tensor import DTensor

    out = []
    for k in sorted(frozen):
        t = frozen[k]
        local = t._local_tensor if isinstance(t, DTensor) else t
        out.append((k, local._version, local.data_ptr()))
    return tuple(out)


def base_fingerprint(model, frozen: dict, pg=None) -> dict:
    """``{"fingerprint", "tensors", "params"}`` of the frozen tensors (collective: every rank)."""
    key = _versions(frozen)
    cached = _FP_CACHE.get(id(model))
    if cached is not None and cached[0] == key:
        return dict(cached[1])
    mine = {}
    for k in sorted(frozen):  # the same order on every rank: DTensor gathers are collectives
        full = _full(frozen[k])
        h = hashlib.blake2b(full.reshape(-1).view(torch.uint8).numpy(), digest_size=16)
        mine[k] = [list(full.shape), str(full.dtype).replace("torch.", ""), h.hexdigest(), full.numel()]
    every = _all_gather(mine, pg)
    merged = {k: v for d in every for k, v in d.items()}  # pipeline stages each hold some
    h = hashlib.sha256(json.dumps({k: v[:3] for k, v in sorted(merged.items())}).encode())
    record = {"fingerprint": h.hexdigest()[:24], "tensors": len(merged), "params": sum(v[3] for v in merged.values())}
    _FP_CACHE[id(model)] = (key, record)
    return dict(record)


def _all_gather(obj, pg) -> list:
    dist = _dist()
    if dist is None:
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=pg)
    return out


def ensure_base(model, frozen: dict, root: str, pg=None) -> dict:
    """The base record for a manifest; writes ``root/bases/<fingerprint>/`` if it is not there yet
    (collective). Each tensor is written by the lowest rank holding it (rank 0 under DDP/FSDP2)."""
    from safetensors.torch import save_file

    record = base_fingerprint(model, frozen, pg)
    dist = _dist()
    rank = dist.get_rank() if dist else 0
    folder = os.path.join(root, BASES, record["fingerprint"])
    record["folder"] = os.path.join(BASES, record["fingerprint"])
    exists = _all_gather(os.path.exists(os.path.join(folder, "base.json")) if rank == 0 else None, pg)[0]
    if exists:
        return record
    tmp = folder + ".partial"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    holders = _all_gather(sorted(frozen), pg)
    writer = {}
    for r, keys in enumerate(holders):
        for k in keys:
            writer.setdefault(k, r)
    mine = [k for k in sorted(frozen) if writer[k] == rank]
    tensors, err = {}, None
    for k in sorted(frozen):  # every rank gathers every DTensor (collective), keeps what it writes
        full = _full(frozen[k], own=True)
        if k in mine:
            tensors[hf_base_name(k)] = full
    fname = f"model-{rank:05d}.safetensors"
    try:
        if tensors:
            save_file(tensors, os.path.join(tmp, fname), metadata={"format": "pt"})
    except OSError as exc:
        err = f"rank {rank} could not write the frozen base into {tmp}: {exc}"
    reports = _all_gather((err, {n: fname for n in tensors}), pg)
    errors = [e for e, _ in reports if e]
    if rank == 0 and not errors:
        weight_map = {n: f for _, m in reports for n, f in m.items()}
        with open(os.path.join(tmp, "model.safetensors.index.json"), "w", encoding="utf-8") as fh:
            json.dump({"metadata": {}, "weight_map": weight_map}, fh, indent=1, sort_keys=True)
        cfg = model_config(model)
        if cfg:
            with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as fh:
                json.dump(cfg, fh, indent=2, sort_keys=True)
        with open(os.path.join(tmp, "base.json"), "w", encoding="utf-8") as fh:
            json.dump(dict(record, folder=None), fh, indent=1, sort_keys=True)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    if errors:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(errors[0])
    _all_gather(None, pg)  # the folder is in place before any rank goes on
    return record


def check_base(manifest_adapter: dict, model, frozen: dict, folder: str, pg=None) -> None:
    """Refuse (on every rank) to apply adapters onto a base other than the one they were trained on."""
    from .safety import IncompatibleCheckpoint

    saved = (manifest_adapter or {}).get("base") or {}
    if not saved:
        return
    if peft_model(model) is None:
        raise IncompatibleCheckpoint(
            "the checkpoint holds a peft adapter (its trainable tensors only) but this model is not a peft "
            f"model: wrap the base with the same peft config ({(manifest_adapter.get('config') or {}).get('peft_type')}) "
            "before loading, or export the adapter (`%distrain ckpt export DIR --hf`)"
        )
    live = base_fingerprint(model, frozen, pg)
    if live["fingerprint"] != saved.get("fingerprint"):
        where = os.path.join(os.path.dirname(os.path.abspath(folder)), saved.get("folder") or "")
        raise IncompatibleCheckpoint(
            f"the checkpoint's adapters were trained on frozen base {saved.get('fingerprint')} "
            f"({saved.get('tensors')} tensors, {saved.get('params'):,} parameters) but this model's base is "
            f"{live['fingerprint']} ({live['tensors']} tensors, {live['params']:,} parameters): nothing was "
            f"loaded. Read the saved base into this model first (engine.load_pretrained({where!r})), or build "
            "the model from that folder (from_pretrained loads it) and wrap it with the same peft config"
        )
