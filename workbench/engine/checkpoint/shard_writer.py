"""DCP's per-rank shard files (``__R_0.distcp``) written without a ``torch.save`` per tensor.

DCP's ``FileSystemWriter`` pickles every tensor in a zip archive, Python that holds the GIL
the training thread waits for (benchmarks/FINDINGS.md). A tensor in ``torch.save``'s legacy
format is a header that depends only on dtype and shape, then its raw bytes: so each tensor
is one ``write`` of a cached header and its bytes, byte for byte what
``torch.save(t, f, _use_new_zipfile_serialization=False)`` writes, which DCP's stock reader reads."""

from __future__ import annotations

import io
import os

import torch
from torch.futures import Future

__all__ = ["writer", "legacy_header"]

_WRITER_CLS = None
_HEADERS: dict[tuple, bytes] = {}


def legacy_header(dtype: torch.dtype, shape: tuple) -> bytes:
    """What ``torch.save``'s legacy format writes before a contiguous tensor's bytes."""
    key = (dtype, tuple(shape))
    head = _HEADERS.get(key)
    if head is None:
        empty = torch.empty(shape, dtype=dtype)
        buf = io.BytesIO()
        torch.save(empty, buf, _use_new_zipfile_serialization=False)
        whole = buf.getvalue()
        head = _HEADERS[key] = whole[: len(whole) - empty.numel() * empty.element_size()]
    return head


def writer(path: str):
    """A ``FileSystemWriter`` (one file a rank, fsynced) whose tensors go out as header + bytes."""
    global _WRITER_CLS
    if _WRITER_CLS is None:
        from torch.distributed.checkpoint import FileSystemWriter
        from torch.distributed.checkpoint.filesystem import _StorageInfo
        from torch.distributed.checkpoint.planner import WriteItemType
        from torch.distributed.checkpoint.storage import WriteResult

        class ShardWriter(FileSystemWriter):
            def _write_data(self, planner, file_queue):
                results = []
                while not file_queue.empty():
                    path, name, items = file_queue.get_nowait()
                    with open(path, "wb") as fh:
                        for item in items:
                            data = planner.resolve_data(item)
                            offset = fh.tell()
                            if item.type == WriteItemType.BYTE_IO:
                                fh.write(data.getbuffer())
                            else:
                                flat = (
                                    data.detach().cpu().contiguous()
                                )  # a sync save's device tensors: copied here, as DCP does
                                fh.write(legacy_header(flat.dtype, flat.shape))
                                if flat.numel():
                                    fh.write(memoryview(flat.reshape(-1).view(torch.uint8).numpy()))
                            info = _StorageInfo(name, offset, fh.tell() - offset)
                            results.append(WriteResult(index=item.index, size_in_bytes=info.length, storage_data=info))
                        fh.flush()
                        if self.sync_files:
                            os.fsync(fh.fileno())
                fut: Future = Future()
                fut.set_result(results)
                return fut

        _WRITER_CLS = ShardWriter
    return _WRITER_CLS(path, single_file_per_rank=True, sync_files=True, thread_count=1)
