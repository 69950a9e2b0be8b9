"""Export a checkpoint's model as ONE consolidated ``.safetensors`` file.

Reads the sharded DCP checkpoint in one process (no process group needed: ``no_dist``),
reassembling every tensor at its full global shape, and writes it with
``safetensors.torch.save_file`` under the model's own parameter names (no ``model.``
prefix), ready for ``safetensors.torch.load_file`` or ``model.load_state_dict``. The
manifest's step, strategy and world size go into the file's string metadata.
"""
from __future__ import annotations

import os

import torch

from . import integrity
from .manifest import read_manifest
from .safety import read_metadata_file

from .manifest import quiet_single_process as _quiet_single_process

__all__ = ["export_safetensors"]

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def export_safetensors(folder: str, path: str, *, dtype: str | None = None) -> dict:
    """Write ``folder``'s model tensors to ``path`` (.safetensors); returns a summary."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from .safety import SafeLoadPlanner, SafeReader

    problems = integrity.verify_folder(folder)
    if problems:
        raise integrity.DamagedCheckpoint(folder, problems)
    manifest = read_manifest(folder)
    meta = read_metadata_file(folder)
    want = {}
    for key, md in meta.state_dict_metadata.items():
        if key.startswith("model.") and isinstance(md, TensorStorageMetadata):
            want[key] = torch.empty(tuple(md.size), dtype=md.properties.dtype)
    if not want:
        raise ValueError(f"{folder} holds no model tensors")
    state = {"model": {k[len("model."):]: v for k, v in want.items()}}
    with _quiet_single_process():
        dcp.load(state, storage_reader=SafeReader(folder), planner=SafeLoadPlanner(), no_dist=True)
    tensors = state["model"]
    if dtype:
        tensors = {k: v.to(_DTYPES[dtype]) if v.is_floating_point() else v for k, v in tensors.items()}
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".partial"
    save_file(tensors, tmp, metadata={"format": "pt", "step": str(manifest.step), "strategy": manifest.strategy,
                                       "world_size": str(manifest.world_size), "source": os.path.basename(folder)})
    os.replace(tmp, path)
    return {"path": path, "tensors": len(tensors), "params": sum(v.numel() for v in tensors.values()),
            "bytes": os.path.getsize(path), "step": manifest.step}
