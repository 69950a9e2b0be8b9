"""Loading never runs code from a checkpoint, and never loads one into the wrong model.

DCP reads ``.metadata`` with plain ``pickle.load`` and non-tensor entries with
``torch.load(weights_only=False)``: :class:`SafeReader` reads the metadata through
:class:`MetadataUnpickler`, and :func:`check_metadata` and :class:`SafeLoadPlanner` refuse
non-tensor entries, which the workbench never writes. :func:`compare` names the tensors
whose keys or shapes do not match the model."""

from __future__ import annotations

import io
import pickle

__all__ = [
    "UnsafeCheckpoint",
    "IncompatibleCheckpoint",
    "MetadataUnpickler",
    "safe_load_metadata",
    "check_metadata",
    "compare",
    "mismatch_message",
]

_DCP_META = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    (_DCP_META, n)
    for n in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "StorageMeta",
        "MetadataIndex",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("pathlib._local", "PosixPath"),
    ("pathlib._local", "WindowsPath"),
    ("collections", "OrderedDict"),
}


class UnsafeCheckpoint(RuntimeError):
    """The checkpoint holds something that would run code or is not plain tensors."""


class IncompatibleCheckpoint(ValueError):
    """The checkpoint's tensors do not fit the model (names the mismatching tensors)."""


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata; any other global is refused (nothing is imported or called)."""

    def find_class(self, module: str, name: str):
        import torch

        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpoint(
            f"the checkpoint's .metadata asks to load {module}.{name}, which is not part of DCP metadata: "
            "refusing to unpickle it (the file may have been tampered with)"
        )


def safe_load_metadata(data: bytes):
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        meta = MetadataUnpickler(io.BytesIO(data)).load()
    except UnsafeCheckpoint:
        raise
    except Exception as exc:
        raise UnsafeCheckpoint(
            f"the checkpoint's .metadata could not be read safely: {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(meta, Metadata):
        raise UnsafeCheckpoint(f"the checkpoint's .metadata holds a {type(meta).__name__}, not DCP Metadata")
    return meta


def check_metadata(meta) -> None:
    """Refuse entries that DCP would read with a full unpickler (non-tensor items)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    blobs = sorted(k for k, v in meta.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata))
    if blobs:
        shown = ", ".join(blobs[:5]) + (" ..." if len(blobs) > 5 else "")
        raise UnsafeCheckpoint(
            f"the checkpoint holds {len(blobs)} pickled (non-tensor) item(s): {shown}. Loading them would unpickle "
            "arbitrary objects; workbench checkpoints keep non-tensor state in JSON. Refusing to load."
        )


def _reader_cls():
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        """``FileSystemReader`` whose ``.metadata`` goes through :class:`MetadataUnpickler`."""

        def read_metadata(self, *args, **kwargs):
            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as fh:
                meta = safe_load_metadata(fh.read())
            check_metadata(meta)
            if getattr(meta, "storage_meta", None) is None:
                meta.storage_meta = StorageMeta()
            meta.storage_meta.load_id = self.load_id
            return meta

    return SafeReader


def _planner_cls():
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value):  # noqa: ARG002
            raise UnsafeCheckpoint(f"refusing to unpickle non-tensor item {read_item.dest_index.fqn!r}")

    return SafeLoadPlanner


def __getattr__(name):  # SafeReader / SafeLoadPlanner are built lazily (torch.distributed import)
    if name == "SafeReader":
        return _reader_cls()
    if name == "SafeLoadPlanner":
        return _planner_cls()
    raise AttributeError(name)


def read_metadata_file(folder: str):
    """DCP metadata of a checkpoint folder, read safely and checked (no ranks needed)."""
    import os

    with open(os.path.join(folder, ".metadata"), "rb") as fh:
        meta = safe_load_metadata(fh.read())
    check_metadata(meta)
    return meta


def compare(saved: dict, wanted: dict) -> tuple[list[str], list[str], list[tuple[str, list, list]]]:
    """(missing, unexpected, shape mismatches) between ``saved`` and ``wanted``: key -> shape."""
    missing = sorted(k for k in wanted if k not in saved)
    unexpected = sorted(k for k in saved if k not in wanted)
    shapes = sorted(
        (k, list(saved[k]), list(wanted[k])) for k in wanted if k in saved and list(saved[k]) != list(wanted[k])
    )
    return missing, unexpected, shapes


def mismatch_message(what: str, missing, unexpected, shapes, *, limit: int = 8) -> str | None:
    if not (missing or unexpected or shapes):
        return None

    def cut(items):
        items = list(items)
        return ", ".join(items[:limit]) + (f" (+{len(items) - limit} more)" if len(items) > limit else "")

    parts = []
    if shapes:
        parts.append("shape mismatch " + cut(f"{k} checkpoint {tuple(a)} vs model {tuple(b)}" for k, a, b in shapes))
    if missing:
        parts.append("missing from the checkpoint " + cut(missing))
    if unexpected:
        parts.append("in the checkpoint but not in the model " + cut(unexpected))
    return (
        f"the checkpoint does not fit this {what}: "
        + "; ".join(parts)
        + " -- build the same model (config) that was saved, or load into a matching one"
    )
