"""The checkpoint manifest: one JSON file that makes a checkpoint exist.

A checkpoint folder is ``ROOT/NAME/`` holding DCP's shards (``__R_0.distcp``), DCP's
``.metadata``, one ``rank-RRRRR.json`` per rank (RNG states, data position) and
``manifest.json`` (with each file's size and checksum: :mod:`.integrity`). Rank 0
writes the manifest last, fsyncs it, then renames the whole
folder from ``NAME.tmp-TOKEN`` to ``NAME``: a folder without a valid manifest, or
still named ``*.tmp-*``, is not a checkpoint. Pure Python (no torch).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, fields

__all__ = [
    "MANIFEST",
    "MANIFEST_VERSION",
    "Manifest",
    "ManifestError",
    "read_manifest",
    "write_json_atomic",
    "fsync_dir",
    "step_name",
    "is_temp",
    "TMP_MARK",
]

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
TMP_MARK = ".tmp-"
OLD_MARK = ".old-"
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]{0,99}$")


class ManifestError(ValueError):
    """A manifest is missing, unreadable or from an unknown version."""


@dataclass(kw_only=True)
class Manifest:
    """What a checkpoint holds; also the row of ``%distrain ckpt list``."""

    version: int = MANIFEST_VERSION
    name: str
    tag: str | None = None
    step: int
    time: float
    world_size: int
    strategy: str
    spec: dict = field(default_factory=dict)
    mesh: dict = field(default_factory=dict)
    loss: float | None = None
    data: dict = field(default_factory=dict)  # data position (JSON), e.g. {"step": 120, "seed": 0}
    auto: bool = False  # written by the auto-save hook (subject to retention)
    async_save: bool = False
    has_optimizer: bool = True
    optimizer: str | None = None  # optimizer class name
    model_tensors: dict = field(default_factory=dict)  # key -> [global shape, dtype]
    optim_tensors: dict = field(default_factory=dict)
    optim_values: dict = field(default_factory=dict)  # non-tensor optimizer entries (lr, betas...)
    rank_files: list = field(default_factory=list)
    files: dict = field(default_factory=dict)  # relative path -> bytes
    integrity: dict = field(default_factory=dict)  # relative path -> [bytes, "ALGO:hex"] (see .integrity)
    bytes: int = 0
    save_seconds: float | None = None
    torch_version: str = ""
    notes: list = field(default_factory=list)
    model_config: dict = field(default_factory=dict)  # a transformers model's config.json (for export_hf)
    # a peft model's adapter: {"name", "config" (peft's), "base": {"fingerprint", "folder" (under the
    # root), "tensors", "params"}}; model_tensors then hold only the trainable tensors
    adapter: dict = field(default_factory=dict)

    def to_json(self) -> str:
        """One field a line, each value in C-encoded compact JSON: ``asdict`` + ``indent`` run
        Python's encoder over every tensor entry, in the save's writer (benchmarks/FINDINGS.md)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        return "{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(d[k], sort_keys=True)}" for k in sorted(d)) + "\n}"

    @classmethod
    def from_dict(cls, d: dict) -> Manifest:
        if not isinstance(d, dict):
            raise ManifestError("manifest.json does not hold a JSON object")
        v = d.get("version")
        if v != MANIFEST_VERSION:
            raise ManifestError(f"manifest version {v!r} is not supported (this workbench reads {MANIFEST_VERSION})")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def param_count(self) -> int:
        n = 0
        for shape, _ in self.model_tensors.values():
            c = 1
            for s in shape:
                c *= int(s)
            n += c
        return n


def read_manifest(folder: str) -> Manifest:
    path = os.path.join(folder, MANIFEST)
    try:
        with open(path, encoding="utf-8") as fh:
            return Manifest.from_dict(json.load(fh))
    except FileNotFoundError:
        raise ManifestError(f"{folder} has no {MANIFEST}: it is not a complete checkpoint") from None
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path} is not valid JSON ({exc})") from None


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_atomic(path: str, obj, *, text: str | None = None) -> None:
    """Write JSON to ``path.partial``, fsync, rename over ``path``, fsync the folder."""
    tmp = path + ".partial"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text if text is not None else json.dumps(obj, indent=1, sort_keys=True))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def step_name(step: int) -> str:
    return f"step-{int(step):08d}"


def check_tag(tag: str) -> str:
    if not _NAME_OK.match(tag) or TMP_MARK in tag or OLD_MARK in tag or tag in ("latest",) or tag.isdigit():
        raise ManifestError(
            f"tag {tag!r} is not usable: use letters, digits and _.=+- (up to 100), not 'latest' or a bare number"
        )
    return tag


def is_temp(name: str) -> bool:
    return TMP_MARK in name or OLD_MARK in name


def quiet_single_process():
    """Silence DCP's "assuming the intent is to save in a single process" (world size 1 is intended)."""
    import contextlib
    import warnings

    @contextlib.contextmanager
    def cm():
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to")
            yield

    return cm()
