"""Tensor shards stored as their raw bytes in DCP's per-rank files (``__R_0.distcp``).

DCP's ``FileSystemWriter`` writes every tensor with its own ``torch.save`` (a zip archive
and a pickle a tensor): ~0.4 ms of Python each, ~60 a rank on the tiny model, most of what
a background write costs the training thread, which waits for the GIL while the writer
holds it. Here each tensor is its bytes, written with one ``write`` (the GIL released);
its dtype and shape are already in DCP's ``.metadata``. Each such item's storage entry
carries the descriptor :data:`RAW`, so a reader without this module refuses it (DCP finds
no extension of that name) instead of misreading it; items without it (checkpoints
written before) are read by DCP as before.
"""

from __future__ import annotations

import dataclasses
import os

import torch
from torch.futures import Future

__all__ = ["RAW", "writer", "read_raw_items"]

RAW = "workbench.raw_bytes"

_WRITER_CLS = None


def writer(path: str):
    """A ``FileSystemWriter`` (one file a rank, fsynced) that writes tensors as raw bytes."""
    global _WRITER_CLS
    if _WRITER_CLS is None:
        from torch.distributed.checkpoint import FileSystemWriter
        from torch.distributed.checkpoint.filesystem import _StorageInfo
        from torch.distributed.checkpoint.planner import WriteItemType
        from torch.distributed.checkpoint.storage import WriteResult

        class RawShardWriter(FileSystemWriter):
            def _write_data(self, planner, file_queue):
                results = []
                while not file_queue.empty():
                    path, name, items = file_queue.get_nowait()
                    with open(path, "wb") as fh:
                        for item in items:
                            data = planner.resolve_data(item)
                            offset, descr = fh.tell(), None
                            if item.type == WriteItemType.BYTE_IO:
                                fh.write(data.getbuffer())
                            else:
                                fh.write(_bytes_of(data))
                                descr = [RAW]
                            info = _StorageInfo(name, offset, fh.tell() - offset, transform_descriptors=descr)
                            results.append(WriteResult(index=item.index, size_in_bytes=info.length, storage_data=info))
                        fh.flush()
                        if self.sync_files:
                            os.fsync(fh.fileno())
                fut: Future = Future()
                fut.set_result(results)
                return fut

        _WRITER_CLS = RawShardWriter
    return _WRITER_CLS(path, single_file_per_rank=True, sync_files=True, thread_count=1)


def _bytes_of(t: torch.Tensor) -> memoryview:
    """The tensor's bytes (a sync save's device tensors are copied to CPU memory first, as DCP does)."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def read_raw_items(reader, plan, planner):
    """Read ``plan``'s raw items into the planner's tensors; return the plan of the rest (for DCP)."""
    from torch.distributed._shard._utils import narrow_tensor_by_index

    raw, rest = {}, []
    for req in plan.items:
        info = reader.storage_data[req.storage_index]
        if info.transform_descriptors and RAW in info.transform_descriptors:
            raw.setdefault(info.relative_path, []).append((req, info))
        else:
            rest.append(req)
    meta = reader.state_dict_metadata
    for rel, reqs in raw.items():
        with open(reader.fs.concat_path(reader.path, rel), "rb") as fh:
            for req, info in sorted(reqs, key=lambda ri: ri[1].offset):
                md = meta[req.storage_index.fqn]
                sizes = _chunk_sizes(md, req.storage_index)
                fh.seek(info.offset)
                buf = bytearray(info.length)
                if fh.readinto(buf) != info.length:
                    raise ValueError(
                        f"{rel} ends inside {req.storage_index.fqn} (its {info.length} bytes at offset {info.offset}): "
                        "the file is cut short"
                    )
                dtype = md.properties.dtype
                tensor = torch.frombuffer(buf, dtype=dtype) if info.length else torch.empty(0, dtype=dtype)
                tensor = tensor.reshape(sizes)
                tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
                target = planner.resolve_tensor(req).detach()
                if target.size() != tensor.size():
                    raise AssertionError(f"req {req.storage_index} mismatch sizes {target.size()} vs {tensor.size()}")
                target.copy_(tensor)
                planner.commit_tensor(req, target)
    return dataclasses.replace(plan, items=rest)


def _chunk_sizes(md, index) -> torch.Size:
    """The saved chunk's shape: the chunk of ``md`` that starts at the index's offset."""
    chunks = md.chunks
    if index.index is not None and index.index < len(chunks) and chunks[index.index].offsets == index.offset:
        return chunks[index.index].sizes
    for c in chunks:
        if c.offsets == index.offset:
            return c.sizes
    raise ValueError(f"{index.fqn}: no saved chunk starts at {tuple(index.offset)}")
