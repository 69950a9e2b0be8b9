"""A parallelism layout: how many ranks along each axis, and how they are used.

The mesh order is ``(pp, dp_replicate, dp_shard, cp, tp)``, outermost to innermost, as
torchtitan's ``ParallelDims``: TP ranks are neighbours in a node, only pipeline sends cross
nodes. DDP is ``dp_replicate=N, zero_stage=0``, FSDP ``dp_shard=N, zero_stage=3``, HSDP both."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from .model_spec import ModelSpec

SCHEDULES = ("1f1b", "gpipe", "interleaved")
PRECISIONS = ("bf16", "fp32", "fp16", "fp8")
RECOMPUTE = ("none", "selective", "full")
ATTENTIONS = ("flash", "eager")
MESH_DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


@dataclass(frozen=True, kw_only=True)
class PlanLayout:
    """Parallel degrees and training choices (keyword-only, frozen, validated).

    virtual_stages is v of the interleaved schedule (model chunks per pipeline rank,
    Narayanan et al. 2021); it must be >= 2 for "interleaved" and 1 otherwise.
    attention: "flash" (fused kernel: FlashAttention, PyTorch SDPA; the s x s scores
    are never stored and the backward recomputes them) or "eager" (softmax(QK^T) as
    tensors: the scores are stored). stage_layers: transformer layers per pipeline
    rank (pp entries) or per model chunk (pp * virtual_stages entries); None splits
    evenly when the layers divide and balances otherwise, "balanced" always balances
    (embedding and head counted as a layer of work each; see pipeline.py).
    """

    dp_replicate: int = 1
    dp_shard: int = 1
    zero_stage: int = 0
    tp: int = 1
    pp: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    cp: int = 1
    ep: int = 1
    precision: str = "bf16"
    recompute: str = "none"
    optimizer_offload: bool = False
    nvme_gbs: float = 0.0  # ZeRO-Infinity: the offloaded optimizer state lives on NVMe at this GB/s per device
    micro_batch_size: int = 1
    seq_parallel: bool = True
    attention: str = "flash"
    stage_layers: tuple[int, ...] | str | None = None
    # LoRA rank (0: full training): every matrix of attention and the MLP gets rank-r adapters;
    # the frozen base then carries no gradient and no optimizer state (memory.model_state_bytes)
    lora_rank: int = 0
    # the input embedding split over tp (vocab-parallel, Megatron-LM); False: whole on every tp
    # rank, as transformers' tensor-parallel plans leave it
    embedding_tp: bool = True
    # the logits stay split over tp into the loss (loss parallel); False: gathered whole to every
    # tp rank (transformers' lm_head "colwise_gather_output", the workbench's plans)
    logits_tp: bool = True
    # the fp32 master weights are the parameters themselves and gradients are fp32, 16-bit only
    # inside forward and backward (torch FSDP2's MixedPrecisionPolicy, autocast): 4 + 4 + 8
    # B/param; False: 16-bit parameters and gradients, the master copy in the optimizer (2+2+12)
    master_params: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise ValueError(f"PlanLayout.lora_rank={self.lora_rank!r}: must be an int >= 0 (0: no LoRA)")
        for field in (
            "dp_replicate",
            "dp_shard",
            "tp",
            "pp",
            "microbatches",
            "cp",
            "ep",
            "micro_batch_size",
            "virtual_stages",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"PlanLayout.{field}={value!r}: must be an int >= 1")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(
                f"PlanLayout.zero_stage={self.zero_stage!r} is out of range: use 0 (none), "
                "1 (optimizer states), 2 (+gradients) or 3 (+parameters, = FSDP)"
            )
        if self.nvme_gbs < 0 or (self.nvme_gbs and not self.optimizer_offload):
            raise ValueError(
                f"PlanLayout.nvme_gbs={self.nvme_gbs!r}: the disk's GB/s per device for an optimizer offloaded "
                "to NVMe; needs optimizer_offload=True (0: offload to CPU memory)"
            )
        _choice("schedule", self.schedule, SCHEDULES)
        _choice("precision", self.precision, PRECISIONS)
        _choice("recompute", self.recompute, RECOMPUTE)
        _choice("attention", self.attention, ATTENTIONS)
        self._check_stage_layers()
        if self.schedule == "interleaved":
            if self.virtual_stages < 2:
                raise ValueError(
                    "PlanLayout: schedule='interleaved' needs virtual_stages >= 2 "
                    "(model chunks per pipeline rank); use virtual_stages=2 or schedule='1f1b'"
                )
            if self.pp < 2:
                raise ValueError("PlanLayout: schedule='interleaved' needs pp >= 2; use schedule='1f1b' with pp=1")
            if self.microbatches % self.pp:
                raise ValueError(
                    f"PlanLayout: interleaved 1F1B needs microbatches divisible by pp "
                    f"(Megatron-LM); microbatches={self.microbatches}, pp={self.pp}: "
                    f"use microbatches={_round_up(self.microbatches, self.pp)}"
                )
        elif self.virtual_stages != 1:
            raise ValueError(
                f"PlanLayout: virtual_stages={self.virtual_stages} only applies to "
                "schedule='interleaved'; set schedule='interleaved' or virtual_stages=1"
            )
        if self.dp_shard > 1 and self.zero_stage == 0:
            raise ValueError(
                f"PlanLayout: dp_shard={self.dp_shard} shards model states, which needs "
                "zero_stage 1, 2 or 3; for plain DDP use "
                f"dp_replicate={self.dp_shard}, dp_shard=1"
            )
        if self.zero_stage > 0 and self.dp_shard * self.cp == 1 and self.dp_replicate > 1:
            raise ValueError(
                f"PlanLayout: zero_stage={self.zero_stage} shards over dp_shard, but "
                f"dp_shard=1 and dp_replicate={self.dp_replicate}: use "
                f"dp_shard={self.dp_replicate}, dp_replicate=1 (or zero_stage=0 for DDP)"
            )
        dp = self.dp_replicate * self.dp_shard
        if self.ep > 1 and dp % self.ep:
            raise ValueError(
                f"PlanLayout: ep={self.ep} must divide the data-parallel degree "
                f"dp_replicate*dp_shard={dp} (experts are spread over data-parallel ranks); "
                f"use ep in {_divisors(dp)}"
            )

    # ------------------------------------------------------------------ derived sizes
    @property
    def dp(self) -> int:
        """Data-parallel degree: number of different batches processed at once."""
        return self.dp_replicate * self.dp_shard

    @property
    def shard_degree(self) -> int:
        """Ranks ZeRO shards model states over (dp_shard x cp, as torchtitan's dp_shard_cp)."""
        return self.dp_shard * self.cp if self.zero_stage > 0 else 1

    @property
    def grad_sync_degree(self) -> int:
        """Ranks that hold the same parameters and must agree on gradients."""
        return self.dp_replicate * self.dp_shard * self.cp

    @property
    def world_size(self) -> int:
        return prod(self.mesh_shape())

    def mesh_shape(self) -> tuple[int, int, int, int, int]:
        """Sizes for `init_device_mesh`, in the order of `mesh_dim_names()`."""
        return (self.pp, self.dp_replicate, self.dp_shard, self.cp, self.tp)

    @staticmethod
    def mesh_dim_names() -> tuple[str, ...]:
        return MESH_DIM_NAMES

    def coordinate(self, rank: int) -> dict[str, int]:
        """Position of a global rank on each mesh dim (row-major, tp fastest)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world size {self.world_size}")
        coords: dict[str, int] = {}
        for name, size in zip(reversed(MESH_DIM_NAMES), reversed(self.mesh_shape())):
            coords[name] = rank % size
            rank //= size
        return {name: coords[name] for name in MESH_DIM_NAMES}

    def stride(self, dim: str) -> int:
        """Distance in global rank between neighbours along `dim` (product of inner sizes)."""
        index = MESH_DIM_NAMES.index(dim)
        return prod(self.mesh_shape()[index + 1 :])

    def describe(self) -> str:
        parts = [f"{n}={s}" for n, s in zip(MESH_DIM_NAMES, self.mesh_shape()) if s > 1]
        if self.ep > 1:
            parts.append(f"ep={self.ep}")
        if self.zero_stage:
            parts.append(f"zero{self.zero_stage}")
        if self.pp > 1:
            sched = self.schedule + (f"(v={self.virtual_stages})" if self.schedule == "interleaved" else "")
            parts.append(f"{sched} m={self.microbatches}")
        if self.pp > 1 and self.stage_layers is not None:
            parts.append("stages=" + ("balanced" if self.stage_layers == "balanced" else _fold(self.stage_layers)))
        if self.recompute != "none":
            parts.append(f"recompute={self.recompute}")
        if self.optimizer_offload:
            parts.append(f"offload=nvme({self.nvme_gbs:g} GB/s)" if self.nvme_gbs else "offload")
        if self.tp > 1 and not self.embedding_tp:
            parts.append("embedding-whole")
        if self.tp > 1 and not self.logits_tp:
            parts.append("logits-gathered")
        if self.master_params:
            parts.append("fp32-params")
        return " ".join(parts) or "single rank"

    # ------------------------------------------------------------- model validation
    def validate_for(self, model: ModelSpec) -> None:
        """Raise ValueError if this layout cannot split `model`; say what would work."""
        if model.heads % self.tp:
            raise ValueError(
                f"tp={self.tp} does not divide heads={model.heads}: each tensor-parallel "
                f"rank needs whole attention heads; use tp in {_divisors(model.heads)}"
            )
        if model.kv_heads % self.tp and self.tp % model.kv_heads:
            raise ValueError(
                f"tp={self.tp} and kv_heads={model.kv_heads}: one must divide the other "
                "(kv heads are split, or replicated when tp > kv_heads)"
            )
        if model.ffn % self.tp:
            raise ValueError(
                f"tp={self.tp} does not divide ffn={model.ffn}; use tp in {_divisors(model.ffn, limit=64)}"
            )
        if self.pp > model.layers:
            raise ValueError(
                f"pp={self.pp} exceeds layers={model.layers}: every pipeline stage needs "
                f"at least one layer; use pp <= {model.layers}"
            )
        if isinstance(self.stage_layers, tuple) and sum(self.stage_layers) != model.layers:
            raise ValueError(
                f"stage_layers={list(self.stage_layers)} add up to {sum(self.stage_layers)} "
                f"but the model has layers={model.layers}; give counts that sum to "
                f"{model.layers}, or stage_layers='balanced'"
            )
        if model.seq_len % self.cp:
            raise ValueError(
                f"cp={self.cp} does not divide seq_len={model.seq_len}; context parallelism splits each sequence evenly"
            )
        if self.ep > 1 and not model.is_moe:
            raise ValueError(f"ep={self.ep} needs a mixture-of-experts model (experts > 1); use ep=1 for a dense model")
        if self.ep > 1 and model.experts % self.ep:
            raise ValueError(
                f"ep={self.ep} does not divide experts={model.experts}; use ep in {_divisors(model.experts)}"
            )

    def layers_per_stage(self, model: ModelSpec) -> int:
        """Transformer layers on the busiest pipeline rank (the real assignment)."""
        from .pipeline import rank_layers  # pipeline.py names PlanLayout only in annotations

        return max(rank_layers(model, self))

    def _check_stage_layers(self) -> None:
        given = self.stage_layers
        if given is None or given == "balanced":
            return
        if isinstance(given, str):
            raise ValueError(
                f"PlanLayout.stage_layers={given!r}: give layer counts per stage (a tuple of ints), 'balanced', or None"
            )
        counts = tuple(given)
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
            raise ValueError(f"PlanLayout.stage_layers={list(counts)}: counts must be ints >= 0")
        if self.pp == 1:
            raise ValueError(
                "PlanLayout.stage_layers needs pp >= 2 (it says how the layers are split over pipeline stages)"
            )
        chunks = self.pp * self.virtual_stages
        if len(counts) not in (self.pp, chunks):
            raise ValueError(
                f"PlanLayout.stage_layers has {len(counts)} entries: give one per pipeline "
                f"rank ({self.pp})" + (f" or one per model chunk ({chunks})" if chunks != self.pp else "")
            )
        per_rank = [sum(counts[r :: self.pp]) for r in range(self.pp)]
        if min(per_rank) < 1:
            raise ValueError(
                f"PlanLayout.stage_layers={list(counts)} leaves pipeline rank "
                f"{per_rank.index(0)} without a transformer layer; give every "
                "rank at least one"
            )
        object.__setattr__(self, "stage_layers", counts)


def _fold(counts: tuple[int, ...]) -> str:
    """(7, 8, 8, 8, 7) -> '7,8*3,7': the form --stages takes."""
    parts: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        parts.append(str(counts[i]) if j - i == 1 else f"{counts[i]}*{j - i}")
        i = j
    return ",".join(parts)


def _choice(field: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"PlanLayout.{field}={value!r} is not one of {', '.join(allowed)}")


def _divisors(n: int, limit: int | None = None) -> list[int]:
    found = [d for d in range(1, n + 1) if n % d == 0]
    return [d for d in found if limit is None or d <= limit]


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k
