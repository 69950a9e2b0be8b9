"""What parallelism to apply: a frozen, keyword-only ``StrategySpec`` and its validation.

Pure logic (no torch.distributed): the notebook side validates a spec against the world
size and model before any rank is touched, and ranks validate it again in ``prepare``.
``validate`` raises ``SpecError`` with one message naming what is wrong and what would
work instead.
"""

from __future__ import annotations

import difflib
import shlex
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from .parallel_dims import DimsError, ParallelDims

__all__ = ["StrategySpec", "SpecError", "spec_from_args", "KINDS", "MeshPlan", "ParallelDims", "PRESET_DIMS"]

# Preset names over the degrees (what users type); ``kind`` of a resolved spec is the label
# of the degrees actually enabled (e.g. "fsdp2 tp=2" -> "fsdp2_tp", "pp dp_shard=2" -> "pp").
KINDS = ("none", "ddp", "fsdp2", "zero", "tp", "pp", "fsdp2_tp")
# Mesh dimensions a preset keeps even at size 1 (a 1-rank world still has a named mesh).
PRESET_DIMS = {
    "ddp": ("dp_replicate",),
    "fsdp2": ("dp_shard",),
    "tp": ("tp",),
    "pp": ("pp",),
    "fsdp2_tp": ("dp_shard", "tp"),
}
DTYPES = ("fp32", "bf16", "fp16")
AC_MODES = ("none", "full", "selective")
SCHEDULES = ("gpipe", "1f1b")
VIA = ("auto", "native", "accelerate")
FP8_RECIPES = ("none", "tensorwise", "rowwise")  # torchao float8 training recipes
FP8_KINDS = ("none", "ddp", "fsdp2", "tp", "fsdp2_tp")
OFFLOAD = ("none", "cpu", "nvme")  # DeepSpeed's offload_param / offload_optimizer devices
ZERO_ONLY = (
    "offload_param",
    "offload_optimizer",
    "nvme_path",
    "nvme_max_in_cpu",
    "quantized_weights",
    "quantized_gradients",
    "hpz",
)
KIND_HELP = {
    "none": "no parallelism: every rank trains its own full copy",
    "ddp": "DistributedDataParallel: full replicas, gradients all-reduced (dp_replicate = all ranks)",
    "fsdp2": "fully_shard (FSDP2): parameters, gradients and optimizer state sharded",
    "zero": "DeepSpeed ZeRO stage 0-3",
    "tp": "tensor parallel (DTensor) over all ranks",
    "pp": "pipeline parallel (torch.distributed.pipelining) over all ranks",
    "fsdp2_tp": "2D: FSDP2 over 'dp_shard' x tensor parallel over 'tp'",
}
DEGREE_FIELDS = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")


class SpecError(ValueError):
    """An invalid strategy: the message says what is wrong and what would work."""


@dataclass(frozen=True)
class MeshPlan:
    """The resolved device-mesh shape of a spec at a given world size."""

    shape: tuple[int, ...]
    dim_names: tuple[str, ...]

    def size(self, name: str) -> int:
        return self.shape[self.dim_names.index(name)] if name in self.dim_names else 1


@dataclass(frozen=True, kw_only=True)
class StrategySpec:
    """How to parallelise a model: independent degrees ``dp_replicate x dp_shard x cp x tp x pp``
    (product = world size; one may be -1, "the rest") and ``kind``, the preset they start
    from. Degrees left at their defaults fill the world: ``dp_shard=-1`` takes what the
    others leave; ``ddp`` replicates over all ranks; for ``tp``/``pp`` a degree of 1 means
    "all ranks". ``resolve`` makes every degree explicit and ``kind`` the label of what is
    enabled."""

    kind: str = "ddp"
    dp_replicate: int = 1
    dp_shard: int = -1
    cp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    pp_schedule: str = "gpipe"
    pp_microbatches: int | None = None  # None: 2 x pp
    zero_stage: int = 2
    reshard_after_forward: bool = True
    param_dtype: str = "fp32"
    reduce_dtype: str | None = None  # None: fp32
    activation_checkpointing: str = "none"
    compile: bool = False
    cpu_offload: bool = False
    sequence_parallel: bool = True
    via: str = "auto"  # "auto": Accelerate on CUDA where it has the path, native otherwise
    fp8: str = "none"  # torchao float8 training of the block linears: tensorwise / rowwise scaling
    fp8_emulate: bool = False  # torchao's emulation: fp8 numerics on high-precision matmuls (CPU, tests)
    cuda_graphs: bool = False  # compile each block with mode="reduce-overhead" (CUDA graphs), CUDA only
    # DeepSpeed ZeRO-Infinity (offload to CPU or an NVMe folder) and ZeRO++ (Wang et al. 2023)
    offload_param: str = "none"
    offload_optimizer: str = "none"
    nvme_path: str | None = None  # the folder on a fast local disk that NVMe offload swaps into
    nvme_buffer_count: int = 5  # parameter swap buffers of nvme_buffer_size elements each
    nvme_buffer_size: int = 100_000_000
    # parameter elements DeepSpeed keeps in host memory with offload_param=nvme (its max_in_cpu):
    # a model under it is read from disk once and then trains from memory; 0 swaps every use
    nvme_max_in_cpu: int = 1_000_000_000
    quantized_weights: bool = False  # ZeRO++ qwZ: int8 weight all-gather
    quantized_gradients: bool = False  # ZeRO++ qgZ: int4 gradient reduce-scatter
    hpz: int = 1  # ZeRO++ hpZ: a secondary weight copy sharded within groups of this many ranks

    # ------------------------------------------------------------------ construction
    @classmethod
    def parse(cls, text: str) -> StrategySpec:
        """``StrategySpec.parse("fsdp2 tp=2 dtype=bf16")``; also accepts ``--tp 2`` style."""
        return spec_from_args(shlex.split(text))

    def with_(self, **changes) -> StrategySpec:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StrategySpec:
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise SpecError(f"unknown StrategySpec field(s) {sorted(unknown)}; valid: {sorted(names)}")
        return cls(**d)

    # ------------------------------------------------------------------ resolution
    @property
    def microbatches(self) -> int:
        return self.pp_microbatches if self.pp_microbatches is not None else 2 * self.pp

    @property
    def reduce(self) -> str:
        return self.reduce_dtype or "fp32"

    def resolve(self, world_size: int) -> StrategySpec:
        """A copy with every size made explicit for ``world_size`` (``validate`` first)."""
        return _resolve(self, world_size)

    def dims(self, world_size: int) -> ParallelDims:
        """The resolved degrees, with their ``*_enabled`` views."""
        s = self.resolve(world_size)
        return ParallelDims(world_size=world_size, **{n: getattr(s, n) for n in DEGREE_FIELDS})

    def mesh_plan(self, world_size: int) -> MeshPlan:
        s = self.resolve(world_size)
        if s.kind in ("none", "zero"):
            return MeshPlan((world_size,), ("dp",))
        shape, names = s.dims(world_size).mesh_dims(PRESET_DIMS[s.kind])
        return MeshPlan(shape, names)

    def validate(self, world_size: int, model_config=None, device_type: str = "cpu") -> StrategySpec:
        """Raise :class:`SpecError` if this spec cannot run; return the resolved spec."""
        _check_values(self)
        s = _resolve(self, world_size)
        _check_device(s, device_type)
        if model_config is not None:
            _check_model(s, model_config)
        return s

    def describe(self, world_size: int | None = None) -> str:
        parts = [self.kind]
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name != "kind" and v != f.default:
                parts.append(f"{f.name}={v}")
        text = " ".join(parts)
        if world_size is not None:
            m = self.mesh_plan(world_size)
            text += " | mesh " + " x ".join(f"{n}={k}" for n, k in zip(m.dim_names, m.shape))
        return text


# ---------------------------------------------------------------------- validation parts
def _choice(name: str, value, allowed) -> None:
    if value not in allowed:
        near = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise SpecError(f"{name}={value!r} is not one of {list(allowed)}{hint}")


def _check_values(s: StrategySpec) -> None:
    _choice("kind", s.kind, KINDS)
    _choice("pp_schedule", s.pp_schedule, SCHEDULES)
    _choice("param_dtype", s.param_dtype, DTYPES)
    if s.reduce_dtype is not None:
        _choice("reduce_dtype", s.reduce_dtype, DTYPES)
    _choice("activation_checkpointing", s.activation_checkpointing, AC_MODES)
    _choice("via", s.via, VIA)
    _choice("zero_stage", s.zero_stage, (0, 1, 2, 3))
    for name in DEGREE_FIELDS:
        v = getattr(s, name)
        if not isinstance(v, int) or isinstance(v, bool) or (v < 1 and v != -1):
            raise SpecError(f"{name}={v!r} must be a positive integer, or -1 for the rest of the world")
    if s.pp_microbatches is not None and s.pp_microbatches < 1:
        raise SpecError(f"pp_microbatches={s.pp_microbatches} must be >= 1")
    if s.cp not in (1,):
        if s.kind in ("none", "zero", "ddp"):
            raise SpecError(
                f"kind={s.kind!r} with cp={s.cp}: context parallel shards the parameters over dp_shard x cp "
                f"(FSDP2, as torchtitan does); use 'fsdp2 cp={s.cp}' (or 'cp={s.cp}', 'fsdp2 cp={s.cp} tp=2')"
            )
        if s.kind == "pp" or s.pp not in (1,):
            raise SpecError(
                f"cp={s.cp} with pipeline parallel is not supported here (a stage does not carry the "
                "sequence positions); use cp with dp_shard / tp, or pp without cp"
            )
        if s.compile:
            raise SpecError(
                f"cp={s.cp} with compile is not supported here (ring attention sends inside the blocks); "
                "drop it, or use cp=1"
            )
    if s.ep != 1:
        _check_ep(s)
    on = lambda n: getattr(s, n) not in (1,)  # noqa: E731  (set by the user: >1 or -1)
    if s.kind in ("none", "ddp", "zero"):
        for name in ("tp", "pp"):
            if on(name):
                raise SpecError(
                    f"kind={s.kind!r} has no {name} dimension but {name}={getattr(s, name)}; "
                    f"use {'fsdp2 tp=N' if name == 'tp' else 'pp=N dp_shard=M'} (degrees combine), or drop {name}"
                )
    if s.kind in ("none", "zero") and s.dp_replicate != 1:
        raise SpecError(
            f"kind={s.kind!r} has no dp_replicate dimension but dp_replicate={s.dp_replicate}; "
            "use hsdp / 'fsdp2 dp_replicate=R', or drop dp_replicate"
        )
    if s.kind == "ddp" and s.dp_shard not in (-1, 1):
        raise SpecError(
            f"kind='ddp' replicates over every rank, but dp_shard={s.dp_shard}; "
            "use 'fsdp2' (or 'hsdp' with dp_replicate) to shard, or drop dp_shard"
        )
    if s.compile and (s.kind == "pp" or s.pp not in (1,)):
        raise SpecError("compile=True with pipeline parallel is not supported here; set compile=False")
    if s.compile and s.kind == "zero":
        raise SpecError("compile=True with DeepSpeed ZeRO is not supported here; set compile=False or use kind='fsdp2'")
    if s.cpu_offload and (s.kind not in ("fsdp2", "zero", "fsdp2_tp") or s.pp != 1):
        raise SpecError(f"cpu_offload=True is implemented for fsdp2, fsdp2_tp and zero, not {s.kind!r}")
    if s.kind == "zero" and s.activation_checkpointing == "selective":
        raise SpecError("activation_checkpointing='selective' is not wired for DeepSpeed; use 'full' or 'none'")
    _check_fp8_graphs(s)
    _check_zero_options(s)


def _check_fp8_graphs(s: StrategySpec) -> None:
    _choice("fp8", s.fp8, FP8_RECIPES)
    if s.fp8 != "none":
        if s.kind not in FP8_KINDS or s.pp not in (1,) or s.cp not in (1,) or s.ep != 1:
            raise SpecError(
                f"fp8={s.fp8!r} with {s.kind if s.kind not in FP8_KINDS else 'pp/cp/ep'} is not wired here; "
                "fp8 composes with fsdp2, tp, 'fsdp2 tp=N', ddp and none"
            )
        if s.param_dtype == "fp16":
            raise SpecError(
                f"fp8={s.fp8!r} with param_dtype='fp16': torchao's fp8 training uses bf16 or fp32; use bf16"
            )
    elif s.fp8_emulate:
        raise SpecError("fp8_emulate=true without fp8: add fp8=tensorwise or fp8=rowwise, or drop fp8_emulate")
    extras = [n for n in ("fp8", "cuda_graphs") if getattr(s, n) not in ("none", False)]
    extras += [n for n in ZERO_ONLY if n in ("offload_param", "offload_optimizer") and getattr(s, n) != "none"]
    extras += [n for n in ("quantized_weights", "quantized_gradients") if getattr(s, n)] + (
        ["hpz"] if s.hpz != 1 else []
    )
    if s.via == "accelerate" and extras:
        raise SpecError(
            f"{', '.join(extras)} with via='accelerate': Accelerate's plugins do not carry it; use via='auto'"
        )
    if s.cuda_graphs:
        if s.kind not in ("none", "ddp", "tp") or s.dp_shard not in (1, -1) or s.pp not in (1,) or s.cp not in (1,):
            raise SpecError(
                f"cuda_graphs=true with kind={s.kind!r}: a CUDA graph replays fixed kernels and addresses, and FSDP2's "
                "per-block all-gathers, DeepSpeed's hooks and pipeline sends run outside it; use kind 'none', 'ddp' or 'tp'"
            )
        if s.compile:
            raise SpecError("cuda_graphs=true already compiles each block (mode='reduce-overhead'); drop compile=true")
        if s.activation_checkpointing != "none":
            raise SpecError("cuda_graphs=true with activation checkpointing is not supported here; set ac=none")


def _check_zero_options(s: StrategySpec) -> None:
    _choice("offload_param", s.offload_param, OFFLOAD)
    _choice("offload_optimizer", s.offload_optimizer, OFFLOAD)
    defaults = {f.name: f.default for f in fields(StrategySpec)}
    if s.kind != "zero":
        used = [n for n in ZERO_ONLY if getattr(s, n) != defaults[n]]
        if used:
            raise SpecError(
                f"{', '.join(used)} {'is a DeepSpeed ZeRO option' if len(used) == 1 else 'are DeepSpeed ZeRO options'}; "
                "use 'zero stage=3 ...', or drop it"
            )
        return
    if s.cpu_offload and (s.offload_param != "none" or s.offload_optimizer != "none"):
        raise SpecError("cpu_offload=true with offload_param/offload_optimizer: give one (offload_optimizer=cpu ...)")
    nvme = [n for n in ("offload_param", "offload_optimizer") if getattr(s, n) == "nvme"]
    if nvme and not s.nvme_path:
        raise SpecError(f"{nvme[0]}=nvme needs nvme_path=FOLDER (on a fast local disk); or offload to cpu")
    if s.nvme_path and not nvme:
        raise SpecError("nvme_path given but nothing offloaded to it: add offload_optimizer=nvme / offload_param=nvme")
    if s.nvme_buffer_count < 1 or s.nvme_buffer_size < 1:
        raise SpecError("nvme_buffer_count and nvme_buffer_size must be positive (buffers, elements per buffer)")
    if s.nvme_max_in_cpu < 0:
        raise SpecError(f"nvme_max_in_cpu={s.nvme_max_in_cpu}: parameter elements kept in memory, 0 or more")
    if s.nvme_max_in_cpu != defaults["nvme_max_in_cpu"] and s.offload_param != "nvme":
        raise SpecError(
            "nvme_max_in_cpu is how many parameter elements offload_param=nvme keeps in memory: "
            "add offload_param=nvme, or drop it"
        )
    stage3 = [n for n in ("quantized_weights", "quantized_gradients") if getattr(s, n)]
    stage3 += ["offload_param"] if s.offload_param != "none" else []
    stage3 += nvme if "offload_optimizer" in nvme else []
    stage3 += ["hpz"] if s.hpz != 1 else []
    stage3 = list(dict.fromkeys(stage3))
    if stage3 and s.zero_stage != 3:
        raise SpecError(
            f"{', '.join(stage3)} {'needs' if len(stage3) == 1 else 'need'} ZeRO stage 3 (partitioned parameters), not stage {s.zero_stage}; "
            "use 'zero stage=3 ...'"
        )
    if s.hpz < 1:
        raise SpecError(f"hpz={s.hpz} must be a positive number of ranks (1: off)")


def _check_ep(s: StrategySpec) -> None:
    """Expert parallel borrows ranks from ``dp_shard`` (FSDP2); the combinations built here."""
    if s.ep < 1:
        raise SpecError(f"ep={s.ep} must be a positive integer (the ranks that split the experts)")
    for name in ("dp_replicate", "cp", "tp", "pp"):
        if getattr(s, name) not in (1,):
            v = getattr(s, name)
            raise SpecError(
                f"ep={s.ep} with {name}={v} is not supported here: expert parallel is built over dp_shard "
                f"alone ('ep={s.ep}' or 'fsdp2 ep={s.ep}', ep dividing dp_shard). Use ep without {name}, "
                f"or {name}={v} without ep"
            )
    if s.kind != "fsdp2":
        raise SpecError(
            f"kind={s.kind!r} with ep={s.ep}: expert parallel borrows its ranks from dp_shard (FSDP2, as "
            f"torchtitan does); use 'ep={s.ep}' or 'fsdp2 ep={s.ep}'"
        )
    for on, what in (
        (s.activation_checkpointing != "none", f"activation_checkpointing={s.activation_checkpointing!r}"),
        (s.compile, "compile=True"),
        (s.cpu_offload, "cpu_offload=True"),
        (s.param_dtype != "fp32" or s.reduce != "fp32", f"param_dtype={s.param_dtype!r}/reduce_dtype={s.reduce!r}"),
    ):
        if on:
            raise SpecError(f"ep={s.ep} with {what} is not supported here; drop it, or use ep=1")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _requested(s: StrategySpec) -> dict[str, int]:
    """The degrees a preset asks for before resolution (-1: the rest of the world)."""
    d = {n: getattr(s, n) for n in DEGREE_FIELDS}
    other_fill = any(v == -1 for n, v in d.items() if n != "dp_shard")
    if other_fill and d["dp_shard"] == -1:
        d["dp_shard"] = 1
    if s.kind == "ddp":
        d["dp_shard"] = 1 if d["dp_shard"] == -1 else d["dp_shard"]
        if d["dp_replicate"] == 1 and not other_fill:
            d["dp_replicate"] = -1
    elif s.kind in ("tp", "pp"):
        if d[s.kind] == 1:
            d[s.kind] = -1
            d["dp_shard"] = 1 if d["dp_shard"] == -1 else d["dp_shard"]
        elif d["dp_shard"] == -1:
            d["dp_shard"] = 1
    return d


def _label(kind: str, d: ParallelDims) -> str:
    if d.pp > 1:
        return "pp"
    if d.tp > 1:
        return (
            "fsdp2_tp" if (d.dp_shard > 1 or d.dp_replicate > 1 or d.cp > 1 or kind in ("fsdp2", "fsdp2_tp")) else "tp"
        )
    if d.dp_shard > 1 or d.cp > 1:
        return "fsdp2"
    if d.dp_replicate > 1:
        return "ddp" if kind in ("ddp", "tp", "pp") else "fsdp2"
    return kind  # one rank: the preset says what to apply


def _resolve(s: StrategySpec, world: int) -> StrategySpec:
    if world < 1:
        raise SpecError(f"world_size={world} must be >= 1")
    k = s.kind
    if k in ("none", "zero"):
        dp = world if s.dp_shard == -1 else s.dp_shard
        if dp != world:
            raise SpecError(
                f"kind={k!r} with dp_shard={s.dp_shard} needs {s.dp_shard} ranks but the world has {world}; use dp_shard=-1 (all {world} ranks)"
            )
        return replace(s, dp_shard=dp)
    req = _requested(s)
    try:
        d = ParallelDims.build(world, **req)
    except DimsError as e:
        alone = k in ("tp", "pp") and all(v in (1, -1) for n, v in req.items() if n != k)
        if alone and req[k] > 1:
            raise SpecError(
                f"kind={k!r} uses all ranks for {'tensor parallel' if k == 'tp' else 'pipeline stages'}: "
                f"{k}={req[k]} != world_size={world}; use {k}={world}"
                + (
                    f", or give the rest to data parallel: '{k}={req[k]} dp_shard={world // req[k]}'"
                    if world % req[k] == 0
                    else ""
                )
            ) from None
        raise SpecError(str(e)) from None
    if d.dp_replicate > 1 and d.dp_shard == 1 and (d.tp > 1 or d.pp > 1):
        raise SpecError(
            f"dp_replicate={d.dp_replicate} with {'tp' if d.tp > 1 else 'pp'}: plain replication (DDP) does "
            f"not compose with other degrees here; use dp_shard={d.dp_replicate} (FSDP2) instead, "
            "or hsdp (dp_replicate=R dp_shard=S)"
        )
    return replace(s, kind=_label(k, d), **{n: getattr(d, n) for n in DEGREE_FIELDS})


def _check_device(s: StrategySpec, device: str) -> None:
    if device not in ("cpu", "cuda"):
        raise SpecError(f"device_type={device!r}: use 'cpu' or 'cuda'")
    if device == "cpu":
        for name in ("param_dtype", "reduce_dtype"):
            if getattr(s, name) == "fp16":
                raise SpecError(
                    f"{name}='fp16' is not supported on CPU (gloo, no fp16 kernels for training); use 'bf16' or 'fp32'"
                )
        if s.cpu_offload:
            raise SpecError(
                "cpu_offload=True on a CPU device: parameters and optimizer state already live in host memory; set cpu_offload=False (offload needs CUDA)"
            )
        if s.via == "accelerate":
            raise SpecError(
                "via='accelerate' needs CUDA ranks here; on CPU use via='auto' or 'native' (the same strategy through torch.distributed)"
            )
        if s.kind == "zero" and s.param_dtype != "fp32":
            raise SpecError(
                f"DeepSpeed ZeRO with param_dtype={s.param_dtype!r} on CPU is not supported here; use param_dtype='fp32' or kind='fsdp2'"
            )
    if device == "cpu":
        _check_cpu_only(s)
    if s.kind == "zero" and s.hpz > 1 and (s.hpz >= s.dp_shard or s.dp_shard % s.hpz):
        raise SpecError(
            f"hpz={s.hpz} must divide the {s.dp_shard} ZeRO ranks and be fewer (a group per node); "
            f"use hpz in {[d for d in _divisors(s.dp_shard) if 1 < d < s.dp_shard] or [1]}"
        )
    if (s.kind in ("ddp", "tp", "pp", "none") or s.pp > 1) and s.reduce not in ("fp32",):
        raise SpecError(
            f"reduce_dtype={s.reduce_dtype!r} with kind={s.kind!r}: gradients are reduced in fp32 (param_dtype sets autocast only); use kind='fsdp2' for low-precision reduction"
        )


def _check_cpu_only(s: StrategySpec) -> None:
    if s.fp8 != "none" and not s.fp8_emulate:
        raise SpecError(
            f"fp8={s.fp8!r} on CPU: fp8 matmuls need CUDA with SM >= 8.9; add fp8_emulate=true for fp8 numerics "
            "(torchao's emulation, no speed-up), or run on a GPU"
        )
    if s.cuda_graphs:
        raise SpecError("cuda_graphs=true on CPU: CUDA graphs need CUDA ranks; drop it (or compile=true for inductor)")
    for name in ("quantized_weights", "quantized_gradients"):
        if getattr(s, name):
            raise SpecError(f"{name}=true on CPU: ZeRO++'s quantizer kernels are CUDA only; drop it on CPU ranks")
    if s.hpz != 1:
        raise SpecError(f"hpz={s.hpz} on CPU: ZeRO++'s hierarchical partitioning is built for CUDA ranks; drop it")
    if "cpu" in (s.offload_param, s.offload_optimizer):
        raise SpecError("offload to cpu on a CPU device: the state already lives in host memory; drop it")


def _check_model(s: StrategySpec, cfg) -> None:
    gcfg = getattr(cfg, "gpt", cfg)
    is_moe = hasattr(cfg, "n_experts")
    if s.tp > 1:
        heads, kv = gcfg.n_heads, gcfg.kv_heads
        bad = [
            f"{n}={v}"
            for n, v in (("n_heads", heads), ("n_kv_heads", kv), ("ffn hidden", gcfg.hidden_dim), ("vocab", gcfg.vocab))
            if v % s.tp
        ]
        if bad:
            from math import gcd

            ok = [t for t in _divisors(gcd(gcd(heads, kv), gcd(gcfg.hidden_dim, gcfg.vocab))) if t > 1]
            raise SpecError(
                f"tp={s.tp} does not divide {', '.join(bad)}; tensor parallel splits whole heads, so use tp in {ok or [1]}"
            )
        if s.sequence_parallel and gcfg.max_seq_len % s.tp:
            raise SpecError(
                f"sequence_parallel with tp={s.tp} needs max_seq_len={gcfg.max_seq_len} divisible by {s.tp}; set sequence_parallel=False"
            )
        if is_moe and s.sequence_parallel:
            raise SpecError(
                "MoE blocks with tensor parallel need sequence_parallel=False (experts are replicated across tp ranks)"
            )
        if gcfg.tie_embeddings:
            raise SpecError(
                "tie_embeddings=True with tensor parallel is not supported; use a config with tie_embeddings=False"
            )
    if s.ep > 1:
        if not is_moe:
            raise SpecError(
                f"ep={s.ep} needs a mixture-of-experts model (an MoEConfig with n_experts); "
                f"{type(cfg).__name__} has no experts: use ep=1"
            )
        if cfg.n_experts % s.ep:
            raise SpecError(
                f"ep={s.ep} does not divide n_experts={cfg.n_experts}; use ep in {_divisors(cfg.n_experts)[1:]}"
            )
    if s.pp > 1 or s.kind == "pp":
        if s.pp > gcfg.n_layers:
            raise SpecError(
                f"pp={s.pp} pipeline stages for n_layers={gcfg.n_layers}: each stage needs a layer; use pp <= {gcfg.n_layers} (or a deeper model)"
            )
        if gcfg.tie_embeddings and s.pp > 1:
            raise SpecError(
                "tie_embeddings=True across pipeline stages is not supported (the tied weight would live on two stages)"
            )
        if is_moe:
            raise SpecError(
                "MoE models with pipeline parallel are not supported here (the auxiliary loss would not reach the last stage)"
            )


# ---------------------------------------------------------------------- argv parsing
ALIASES = {
    "dtype": "param_dtype",
    "precision": "param_dtype",
    "reduce": "reduce_dtype",
    "ac": "activation_checkpointing",
    "checkpointing": "activation_checkpointing",
    "mb": "pp_microbatches",
    "microbatches": "pp_microbatches",
    "schedule": "pp_schedule",
    "stage": "zero_stage",
    "offload": "cpu_offload",
    "sp": "sequence_parallel",
    "reshard": "reshard_after_forward",
    "dp": "dp_shard",
    "replicate": "dp_replicate",
    "shard": "dp_shard",
}
KIND_ALIASES = {
    "fsdp": ("fsdp2", {}),
    "2d": ("fsdp2_tp", {}),
    "fsdp_tp": ("fsdp2_tp", {}),
    "deepspeed": ("zero", {}),
    "zero1": ("zero", {"zero_stage": 1}),
    "zero2": ("zero", {"zero_stage": 2}),
    "zero3": ("zero", {"zero_stage": 3}),
    "zero0": ("zero", {"zero_stage": 0}),
    "pipeline": ("pp", {}),
    "tensor": ("tp", {}),
    "single": ("none", {}),
    "hsdp": ("fsdp2", {"dp_replicate": 2}),  # replicate over 2 groups, shard within each
}
TRUE, FALSE = ("1", "true", "yes", "on", "y"), ("0", "false", "no", "off", "n")


def _convert(name: str, raw: str):
    f = next(f for f in fields(StrategySpec) if f.name == name)
    t = str(f.type)
    if "bool" in t:
        if raw.lower() in TRUE:
            return True
        if raw.lower() in FALSE:
            return False
        raise SpecError(f"{name}={raw!r}: expected true/false")
    if "int" in t:
        if raw.lower() in ("none", "auto") and "None" in t:
            return None
        try:
            return int(raw)
        except ValueError:
            raise SpecError(f"{name}={raw!r}: expected an integer") from None
    if name == "nvme_path":
        return raw  # a folder: its case matters
    if raw.lower() == "none" and "None" in t and name != "activation_checkpointing":
        return None
    return raw.lower()


def _field_name(key: str) -> str:
    key = key.strip().lstrip("-").replace("-", "_").lower()
    key = ALIASES.get(key, key)
    names = [f.name for f in fields(StrategySpec)]
    if key not in names:
        near = difflib.get_close_matches(key, names + list(ALIASES), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise SpecError(f"unknown strategy option {key!r}{hint}; valid: {', '.join(names)}")
    return key


def _kind_of_degrees(v: dict) -> str:
    """The preset that bare degrees (``pp=2 dp_shard=2``, ``tp=2``) start from."""
    if v.get("pp", 1) != 1:
        return "pp"
    if v.get("cp", 1) != 1 and v.get("tp", 1) == 1:
        return "fsdp2"  # context parallel shards parameters over dp_shard x cp
    if v.get("tp", 1) != 1:
        return "fsdp2_tp" if v.get("dp_shard", 1) != 1 or v.get("dp_replicate", 1) != 1 else "tp"
    if v.get("dp_shard", -1) != -1 or v.get("ep", 1) != 1:
        return "fsdp2"
    return "fsdp2" if v.get("dp_replicate", 1) != 1 and "dp_shard" in v else "ddp"


def spec_from_args(argv: list[str]) -> StrategySpec:
    """Build a spec from ``["fsdp2", "--tp", "2", "--dtype=bf16", "compile"]``-style args.

    The first bare word is the kind (``fsdp``, ``zero3``, ``2d`` ... are accepted);
    options are ``key=value``, ``--key value``, ``--key=value``, ``--flag`` / ``--no-flag``.
    """
    values: dict[str, Any] = {}
    kind = None
    i = 0
    bool_names = {f.name for f in fields(StrategySpec) if "bool" in str(f.type)}
    while i < len(argv):
        tok = argv[i]
        i += 1
        if "=" in tok:
            key, raw = tok.split("=", 1)
        elif tok.startswith("--"):
            key = tok[2:]
            neg = key.startswith("no-") or key.startswith("no_")
            name = _field_name(key[3:] if neg else key)
            if name in bool_names:
                nxt = argv[i].lower() if i < len(argv) else ""
                if not neg and nxt in TRUE + FALSE:
                    values[name] = nxt in TRUE
                    i += 1
                else:
                    values[name] = not neg
                continue
            if i >= len(argv):
                raise SpecError(f"option {tok} needs a value")
            raw = argv[i]
            i += 1
        else:
            word = tok.lower()
            if kind is None and (word in KINDS or word in KIND_ALIASES):
                kind, extra = (word, {}) if word in KINDS else KIND_ALIASES[word]
                values = {**extra, **values}
                continue
            name = _field_name(word) if kind is not None else None
            if name in bool_names:
                values[name] = True
                continue
            raise SpecError(f"unexpected word {tok!r}: start with a kind ({', '.join(KINDS)}) then key=value options")
        name = _field_name(key)
        if name == "compile" and raw.lower() in ("reduce-overhead", "reduce_overhead", "cuda_graphs"):
            values["cuda_graphs"] = True  # torch.compile's name for compiling into CUDA graphs
            continue
        values[name] = _convert(name, raw)
    if kind is not None:
        values["kind"] = kind
    else:
        values["kind"] = _kind_of_degrees(values)
    if values.get("kind") == "fsdp2" and values.get("tp", 1) > 1:
        values["kind"] = "fsdp2_tp"  # "fsdp2 --tp 2" means FSDP2 x TP (2-D)
    spec = StrategySpec(**values)
    _check_values(spec)
    return spec
