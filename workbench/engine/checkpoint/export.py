"""Export a checkpoint's model as one consolidated ``.safetensors`` file, or as a Hugging Face folder.

Read in one process (no process group: ``no_dist``), every tensor reassembled at its global
shape, so a checkpoint from any layout and world size exports alike; written under the
model's own parameter names, which for a ``transformers`` model are the Hugging Face names
(:func:`export_hf` adds the ``config.json`` the manifest kept)."""

from __future__ import annotations

import json
import os

import torch

from ...shared.checkpoint import integrity
from ...shared.checkpoint.manifest import quiet_single_process as _quiet_single_process
from ...shared.checkpoint.manifest import read_manifest
from .safety import read_metadata_file

__all__ = ["export_safetensors", "export_hf"]

from ...strategies.base import TORCH_DTYPES as _DTYPES


def _read_model(folder: str, dtype: str | None) -> dict:
    """Every model tensor of the checkpoint at its full global shape (one process, no group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from .safety import SafeLoadPlanner, SafeReader

    problems = integrity.verify_folder(folder)
    if problems:
        raise integrity.DamagedCheckpoint(folder, problems)
    meta = read_metadata_file(folder)
    want = {}
    for key, md in meta.state_dict_metadata.items():
        if key.startswith("model.") and isinstance(md, TensorStorageMetadata):
            want[key] = torch.empty(tuple(md.size), dtype=md.properties.dtype)
    if not want:
        raise ValueError(f"{folder} holds no model tensors")
    state = {"model": {k[len("model.") :]: v for k, v in want.items()}}
    with _quiet_single_process():
        dcp.load(state, storage_reader=SafeReader(folder), planner=SafeLoadPlanner(), no_dist=True)
    tensors = state["model"]
    if dtype:
        tensors = {k: v.to(_DTYPES[dtype]) if v.is_floating_point() else v for k, v in tensors.items()}
    return {k: v.contiguous() for k, v in tensors.items()}


def export_safetensors(folder: str, path: str, *, dtype: str | None = None) -> dict:
    """Write ``folder``'s model tensors to ``path`` (.safetensors); returns a summary."""
    from safetensors.torch import save_file

    manifest = read_manifest(folder)
    tensors = _read_model(folder, dtype)
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".partial"
    save_file(
        tensors,
        tmp,
        metadata={
            "format": "pt",
            "step": str(manifest.step),
            "strategy": manifest.strategy,
            "world_size": str(manifest.world_size),
            "source": os.path.basename(folder),
        },
    )
    os.replace(tmp, path)
    return {
        "path": path,
        "tensors": len(tensors),
        "params": sum(v.numel() for v in tensors.values()),
        "bytes": os.path.getsize(path),
        "step": manifest.step,
    }


def _config_for(manifest, config) -> dict:
    """The config.json contents: ``config`` (a dict, a path, or an object with ``to_dict``) or the saved one."""
    if config is None:
        if not manifest.model_config:
            raise ValueError(
                f"checkpoint {manifest.name} keeps no Hugging Face config (the model saved was not a transformers "
                "model): pass config= (a transformers config, a dict or the path of a config.json), or export plain "
                "safetensors with `%distrain ckpt export PATH.safetensors`"
            )
        return dict(manifest.model_config)
    if isinstance(config, (str, os.PathLike)):
        path = os.path.join(config, "config.json") if os.path.isdir(config) else config
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    if isinstance(config, dict):
        return dict(config)
    if hasattr(config, "to_json_string"):
        return json.loads(config.to_json_string(use_diff=False))
    raise TypeError(
        f"config= must be a transformers config, a dict or a path to config.json, got {type(config).__name__}"
    )


def export_hf(
    folder: str, out_dir: str, *, dtype: str | None = None, config=None, max_shard_bytes: int | None = None
) -> dict:
    """Write ``folder``'s model as a Hugging Face folder ``out_dir`` (config.json + safetensors)."""
    from safetensors.torch import save_file

    manifest = read_manifest(folder)
    cfg = _config_for(manifest, config)
    tensors, naming = _as_save_pretrained(cfg, _read_model(folder, dtype))
    floats = {v.dtype for v in tensors.values() if v.is_floating_point()}
    if len(floats) == 1:  # what from_pretrained(dtype="auto") loads it as
        name = str(next(iter(floats))).replace("torch.", "")
        for key in [k for k in ("dtype", "torch_dtype") if k in cfg] or ["torch_dtype"]:
            cfg[key] = name
    out_dir = os.path.abspath(os.path.expanduser(out_dir))
    os.makedirs(out_dir, exist_ok=True)
    meta = {
        "format": "pt",
        "step": str(manifest.step),
        "strategy": manifest.strategy,
        "world_size": str(manifest.world_size),
        "source": os.path.basename(folder),
    }
    shards = _shards(tensors, max_shard_bytes)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    for name, part in zip(names, shards):
        tmp = os.path.join(out_dir, name + ".partial")
        save_file(part, tmp, metadata=meta)
        os.replace(tmp, os.path.join(out_dir, name))
    index = os.path.join(out_dir, "model.safetensors.index.json")
    if len(shards) > 1:
        weight_map = {k: n for n, part in zip(names, shards) for k in part}
        _write_json(
            index, {"metadata": {"total_size": sum(v.nbytes for v in tensors.values())}, "weight_map": weight_map}
        )
    elif os.path.exists(index):  # an earlier sharded export here would shadow the new file
        os.remove(index)
    _write_json(os.path.join(out_dir, "config.json"), cfg)
    return {
        "path": out_dir,
        "files": names,
        "tensors": len(tensors),
        "params": sum(v.numel() for v in tensors.values()),
        "bytes": sum(os.path.getsize(os.path.join(out_dir, n)) for n in names),
        "step": manifest.step,
        "architectures": cfg.get("architectures"),
        "names": naming,
    }


def _as_save_pretrained(cfg: dict, tensors: dict) -> tuple[dict, str]:
    """The tensors under the names ``save_pretrained`` writes, and which names those are.

    transformers 5 keeps MoE experts stacked (``experts.gate_up_proj [E, 2I, H]``) but saves
    them one expert at a time through the model's conversion mapping; the same mapping,
    reversed, is applied here on a model built on the meta device (nothing allocated).
    Models without stacked experts keep their own names (which are the saved ones)."""
    if not any(v.dim() >= 3 and ".experts." in k for k, v in tensors.items()):
        return tensors, "model"
    try:
        import transformers
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # from_pretrained in transformers 5 also loads the stacked names
        return tensors, "model (transformers not installed: experts kept stacked)"
    arch = (cfg.get("architectures") or [None])[0]
    cls = getattr(transformers, arch, None) if arch else None
    if cls is None:
        return tensors, f"model ({arch!r} is not a transformers class: experts kept stacked)"
    with torch.device("meta"):
        model = cls(transformers.AutoConfig.for_model(**cfg))
    out = revert_weight_conversion(model, tensors)
    return {k: v.contiguous() for k, v in out.items()}, "save_pretrained"


def _shards(tensors: dict, max_bytes: int | None) -> list[dict]:
    if not max_bytes:
        return [tensors]
    out: list[dict] = [{}]
    size = 0
    for k, v in tensors.items():
        if out[-1] and size + v.nbytes > max_bytes:
            out.append({})
            size = 0
        out[-1][k] = v
        size += v.nbytes
    return out


def _write_json(path: str, obj) -> None:
    tmp = path + ".partial"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True)
    os.replace(tmp, path)
