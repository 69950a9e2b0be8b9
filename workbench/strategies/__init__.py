"""Parallelism strategies, one module per backend, behind one small Protocol.

``prepare(model, optimizer_factory, spec)`` is the entry point; ``StrategySpec`` says what
to apply and validates it before any rank changes.
"""

from .accelerate_path import reset_accelerate_state
from .base import (
    ModelHints,
    Prepared,
    PrepareError,
    Strategy,
    check_optimizer_matches,
    get_strategy,
    lm_loss,
    register,
    registered,
)
from .blocks import Blocks, find_blocks
from .layout import LAYOUT_VERSION
from .parallel_dims import ParallelDims
from .parallelize import check_layout, parallelize
from .prepare import model_config_of, prepare
from .spec import KINDS, MeshPlan, SpecError, StrategySpec, spec_from_args

__all__ = [
    "StrategySpec",
    "SpecError",
    "spec_from_args",
    "KINDS",
    "MeshPlan",
    "prepare",
    "Prepared",
    "PrepareError",
    "Strategy",
    "register",
    "registered",
    "get_strategy",
    "lm_loss",
    "check_optimizer_matches",
    "reset_accelerate_state",
    "model_config_of",
    "LAYOUT_VERSION",
    "ParallelDims",
    "ModelHints",
    "Blocks",
    "find_blocks",
    "check_layout",
    "parallelize",
]
