"""Parallelism planner: memory, communication, step time and cost of a layout.

Pure arithmetic (no torch.distributed, no processes), so it runs in the notebook
kernel. Start with `plan(ModelSpec.llama("70b"), PlanLayout(...), "h100")` or
`recommend(ModelSpec.llama("70b"), 256, "h100")`.
"""

from .arguments import plan_from_args
from .communication import CommBreakdown, CommItem, communication_per_step, ring_bytes
from .compute import ComputeEstimate, RunCost, bubble_fraction, flops_per_token, implied_mfu, run_cost, training_days
from .flops import TokenFlops, token_flops
from .hardware import HARDWARE, Hardware, load_hardware
from .layout import PlanLayout
from .memory import MemoryBreakdown, activation_bytes_per_layer, memory_per_rank, state_bytes_per_param
from .model_spec import ModelSpec, ParamCount
from .pipeline import assignment_bubble, balanced_layers, chunk_layers, rank_layers
from .recommend import Recommendation, recommend
from .report import Plan, plan

__all__ = [
    "HARDWARE",
    "CommBreakdown",
    "CommItem",
    "ComputeEstimate",
    "Hardware",
    "MemoryBreakdown",
    "ModelSpec",
    "ParamCount",
    "Plan",
    "PlanLayout",
    "Recommendation",
    "RunCost",
    "TokenFlops",
    "activation_bytes_per_layer",
    "assignment_bubble",
    "balanced_layers",
    "bubble_fraction",
    "chunk_layers",
    "communication_per_step",
    "flops_per_token",
    "implied_mfu",
    "load_hardware",
    "memory_per_rank",
    "plan",
    "plan_from_args",
    "rank_layers",
    "recommend",
    "ring_bytes",
    "run_cost",
    "state_bytes_per_param",
    "token_flops",
    "training_days",
]
