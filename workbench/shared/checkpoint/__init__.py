"""Distributed checkpoints: save (sync/async), list, load with resharding, export, safety.

Layout of a checkpoint folder and how it becomes visible: :mod:`.manifest`; sizes and
checksums, verified before any load: :mod:`.integrity`.
Rank side (collective, call on every rank): :func:`save.save`, :func:`load.load`.
Notebook side (pure files, no torch): :mod:`.catalog`.
"""

from .catalog import NoCheckpoint, default_dir, list_checkpoints, resolve, set_default_dir
from .manifest import Manifest, ManifestError, read_manifest

__all__ = [
    "Manifest",
    "ManifestError",
    "NoCheckpoint",
    "default_dir",
    "list_checkpoints",
    "read_manifest",
    "resolve",
    "set_default_dir",
]
