"""Export an adapter checkpoint as peft's folder, or merged into its base as a model folder.

:func:`export_adapter` writes what ``PeftModel.from_pretrained`` loads (peft's config and
saved names, pointing at the saved base); :func:`export_merged` merges with peft's own
``merge_and_unload`` on the saved base, so every LoRA variant merges as peft merges it.
One process, no process group."""

from __future__ import annotations

import json
import os
import tempfile

from ...shared.checkpoint.manifest import read_manifest

__all__ = ["export_adapter", "export_merged", "base_folder"]


def _adapter_manifest(folder: str):
    m = read_manifest(folder)
    if not m.adapter:
        raise ValueError(
            f"checkpoint {m.name} holds a whole model, not a peft adapter: export it with `--hf` (no --merged)"
        )
    return m


def base_folder(folder: str, manifest) -> str:
    """The saved frozen base of an adapter checkpoint (a folder ``from_pretrained`` loads)."""
    base = manifest.adapter.get("base") or {}
    path = os.path.join(os.path.dirname(os.path.abspath(folder)), base.get("folder") or "")
    try:
        with open(os.path.join(path, "base.json"), encoding="utf-8") as fh:
            found = json.load(fh).get("fingerprint")
    except (OSError, ValueError):
        found = None
    if found != base.get("fingerprint"):
        raise FileNotFoundError(
            f"checkpoint {manifest.name}'s frozen base {base.get('fingerprint')} is not at {path} "
            f"({'another base is there' if found else 'no base.json'}): the base is written once beside the "
            "checkpoints (their root's bases/ folder); keep it with them"
        )
    return path


def export_adapter(folder: str, out_dir: str, *, dtype: str | None = None) -> dict:
    """Write ``folder``'s adapter as ``out_dir/adapter_config.json`` + ``adapter_model.safetensors``."""
    from safetensors.torch import save_file

    from .export import _read_model, _write_json

    m = _adapter_manifest(folder)
    name = m.adapter["name"]
    tensors = {k.replace(f".{name}", ""): v for k, v in _read_model(folder, dtype).items()}
    cfg = dict(m.adapter["config"])
    try:
        cfg["base_model_name_or_path"] = base_folder(folder, m)
    except FileNotFoundError:
        pass  # the adapter loads onto a base given to PeftModel.from_pretrained all the same
    cfg["inference_mode"] = True
    out_dir = os.path.abspath(os.path.expanduser(out_dir))
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "adapter_model.safetensors")
    meta = {"format": "pt", "step": str(m.step), "strategy": m.strategy, "world_size": str(m.world_size)}
    save_file(tensors, path + ".partial", metadata=meta)
    os.replace(path + ".partial", path)
    _write_json(os.path.join(out_dir, "adapter_config.json"), cfg)
    return {
        "path": out_dir,
        "files": ["adapter_config.json", "adapter_model.safetensors"],
        "tensors": len(tensors),
        "params": sum(v.numel() for v in tensors.values()),
        "bytes": os.path.getsize(path),
        "step": m.step,
        "architectures": (m.model_config or {}).get("architectures"),
        "names": f"peft {cfg.get('peft_type', 'adapter')} adapter",
    }


def export_merged(folder: str, out_dir: str, *, dtype: str | None = None) -> dict:
    """Write the base with ``folder``'s adapter merged in, as a folder ``from_pretrained`` loads."""
    import transformers
    from peft import PeftModel

    from ...strategies.base import TORCH_DTYPES

    m = _adapter_manifest(folder)
    base_dir = base_folder(folder, m)
    arch = ((m.model_config or {}).get("architectures") or [None])[0]
    cls = getattr(transformers, arch, None) if arch else None
    if cls is None:
        raise ValueError(f"checkpoint {m.name}'s base is a {arch!r}, not a transformers class: export --hf only")
    base = cls.from_pretrained(base_dir)
    with tempfile.TemporaryDirectory(prefix="adapter-") as tmp:
        export_adapter(folder, tmp)
        merged = PeftModel.from_pretrained(base, tmp).merge_and_unload()
    if dtype:
        merged = merged.to(TORCH_DTYPES[dtype])
    out_dir = os.path.abspath(os.path.expanduser(out_dir))
    merged.save_pretrained(out_dir, safe_serialization=True)
    files = sorted(n for n in os.listdir(out_dir) if n.endswith(".safetensors"))
    state = merged.state_dict()
    return {
        "path": out_dir,
        "files": files,
        "tensors": len(state),
        "params": sum(v.numel() for v in state.values()),
        "bytes": sum(os.path.getsize(os.path.join(out_dir, n)) for n in files),
        "step": m.step,
        "architectures": [arch],
        "names": "merged",
    }
