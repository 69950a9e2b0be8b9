"""Notebook side: start, run on, watch and stop persistent rank processes."""

from ...shared.errors import (
    AlreadyRunning,
    CellTimeout,
    Interrupted,
    NotRunning,
    RankDied,
    RankFailure,
    WorkbenchError,
)
from ...shared.ranges import format_ranks, parse_ranks
from .rank_call import RankCall
from .rankset import RankSet, RankSetConfig

__all__ = [
    "AlreadyRunning",
    "CellTimeout",
    "Interrupted",
    "NotRunning",
    "RankCall",
    "RankDied",
    "RankFailure",
    "RankSet",
    "RankSetConfig",
    "WorkbenchError",
    "format_ranks",
    "parse_ranks",
]
