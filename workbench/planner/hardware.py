"""Accelerator catalogue, kept as data in ``hardware.json`` so figures can be updated without
touching code (and read by people who do not read Python). Its conventions (dense peaks,
one-direction bus bandwidth, binary HBM "GB") are stated once in docs/planner.md."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources

GB = 1e9  # sizes the planner prints, link bandwidths
GiB = 2**30  # HBM capacities: the datasheet's "80GB" is 80 GiB


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """One accelerator type. Memory in the datasheet's GB (binary), rates in TFLOP/s and GB/s."""

    key: str
    name: str
    memory_gb: float
    memory_bandwidth_gbs: float
    bf16_tflops: float
    fp8_tflops: float
    intra_node_gbs: float
    inter_node_gbs: float
    devices_per_node: int
    price_usd_per_hour: tuple[float, float]
    host_link_gbs: float = 25.0  # PCIe Gen4 x16 where the catalogue gives none
    notes: str = ""
    aliases: tuple[str, ...] = field(default=(), repr=False)

    @property
    def memory_bytes(self) -> float:
        """HBM capacity in bytes: the datasheet's GB are GiB (see the module docstring)."""
        return self.memory_gb * GiB

    @property
    def price_mid(self) -> float:
        low, high = self.price_usd_per_hour
        return (low + high) / 2

    def peak_flops(self, precision: str = "bf16") -> float:
        """Dense peak FLOP/s for the matmul precision of a layout.

        fp32 training runs its matmuls as TF32 on tensor cores, half the bf16 rate on
        every listed part; fp16 runs at the bf16 rate.
        """
        if precision in ("bf16", "fp16"):
            return self.bf16_tflops * 1e12
        if precision == "fp8":
            return self.fp8_tflops * 1e12
        if precision == "fp32":
            return self.bf16_tflops * 1e12 / 2
        raise ValueError(f"unknown precision {precision!r}; use bf16, fp16, fp8 or fp32")

    @property
    def host_link_bandwidth(self) -> float:
        """Bytes/s per device between device and host memory (optimizer offload)."""
        return self.host_link_gbs * GB

    def link_bandwidth(self, intra_node: bool) -> float:
        """Bytes/s per device over the scale-up fabric (True) or the NIC (False)."""
        return (self.intra_node_gbs if intra_node else self.inter_node_gbs) * GB


def _load_catalogue() -> dict[str, Hardware]:
    text = resources.files(__package__).joinpath("hardware.json").read_text()
    raw = json.loads(text)
    catalogue: dict[str, Hardware] = {}
    for key, entry in raw.items():
        if key.startswith("_"):
            continue
        entry = dict(entry)
        entry["price_usd_per_hour"] = tuple(entry["price_usd_per_hour"])
        entry["aliases"] = tuple(entry.get("aliases", ()))
        catalogue[key] = Hardware(key=key, **entry)
    return catalogue


HARDWARE: dict[str, Hardware] = _load_catalogue()


def load_hardware(name: str | Hardware) -> Hardware:
    """Look up hardware by key or alias, case-insensitively ("h100", "H100-SXM", "v5p").

    A `Hardware` passes through unchanged, so functions can accept either.
    """
    if isinstance(name, Hardware):
        return name
    wanted = str(name).strip().lower().replace("_", "-")
    for key, hw in HARDWARE.items():
        if wanted == key or wanted in (a.lower().replace("_", "-") for a in hw.aliases):
            return hw
    raise ValueError(f"unknown hardware {name!r}; known: {', '.join(HARDWARE)}")
