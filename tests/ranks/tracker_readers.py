"""What the tracker tests read back with: W&B's offline run file, and trackio's folder.

A W&B offline run file (``run-<id>.wandb``):

The file is W&B's datastore: LevelDB's log format (32 KiB blocks of records, each a 7-byte
header: masked CRC32C, length, type full/first/middle/last) after a 7-byte file header
(``:W&B``, magic 0xBEE1, version), each record a ``wandb_internal_pb2.Record``. The wandb
package no longer ships a Python reader (its Go core writes the file), so this is one,
with wandb's own protobuf schema for the records.
"""

from __future__ import annotations

import json
import pathlib
import struct
import sys

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str) -> list:
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    ident, magic, _version = struct.unpack("<4sHB", data[:HEADER])
    assert ident == b":W&B" and magic == 0xBEE1, (ident, magic)
    out, pos, parts = [], HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0 and length == 0:  # zero fill to the end of the block
            pos += left
            continue
        body = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            parts = body
        elif kind == FIRST:
            parts = body
            continue
        elif kind == MIDDLE:
            parts += body
            continue
        else:
            parts += body
        record = wandb_internal_pb2.Record()
        record.ParseFromString(parts)
        out.append(record)
    return out


def history(path: str) -> list[dict]:
    """Every ``run.log`` row of the run, in order: key -> value."""
    rows = []
    for r in records(path):
        if r.WhichOneof("record_type") == "history":
            rows.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item})
    return rows


def config(path: str) -> dict:
    """The run's config as its updates left it."""
    out: dict = {}
    for r in records(path):
        kind = r.WhichOneof("record_type")
        updates = r.config.update if kind == "config" else r.run.config.update if kind == "run" else ()
        if updates:
            for i in updates:
                out["/".join(i.nested_key) or i.key] = json.loads(i.value_json)
    return out


def artifacts(path: str) -> list[str]:
    return [r.artifact.name for r in records(path) if r.WhichOneof("record_type") == "artifact"]


def trackio_dir(default: pathlib.Path) -> pathlib.Path:
    """trackio keeps the folder of its first import in this process: that one, once imported."""
    if "trackio" in sys.modules:
        from trackio import utils

        return pathlib.Path(utils.TRACKIO_DIR)
    return default
