"""NCCL settings for a rank set: ``--nccl ALGO=Ring,PROTO=Simple`` and ``--nccl-preset ib``.

Pure (both sides): the notebook checks every name and value before anything starts, and
each rank puts the result into its environment before its process group initialises
(NCCL reads its ``NCCL_*`` variables when a communicator is created). Names are NCCL's
own, with or without the ``NCCL_`` prefix; a list value continues after a comma
(``ALGO=Ring,Tree,PROTO=Simple``). Values follow NCCL's documentation (env.html, 2.2x).
"""

from __future__ import annotations

import difflib
import re

__all__ = ["NCCL_PRESETS", "NCCL_VARS", "NcclError", "nccl_env"]


class NcclError(ValueError):
    """A bad NCCL setting: the message names it and what NCCL accepts."""


def _words(*allowed: str, many: bool = False):
    """A value from ``allowed`` (case-insensitive); ``many``: a comma list, optionally ``^``-negated."""

    def check(v: str) -> str | None:
        items = v[1:].split(",") if many and v.startswith("^") else v.split(",") if many else [v]
        low = {a.lower(): a for a in allowed}
        bad = [i for i in items if i.lower() not in low]
        if bad:
            return f"one of {', '.join(allowed)}" + (" (a comma list, ^ to exclude)" if many else "")
        return None

    return check


def _int(lo: int, hi: int | None = None):
    def check(v: str) -> str | None:
        ok = re.fullmatch(r"\d+", v) is not None and int(v) >= lo and (hi is None or int(v) <= hi)
        return None if ok else f"an integer {lo}..{hi}" if hi is not None else f"an integer >= {lo}"

    return check


def _text(v: str) -> str | None:
    return None if v and not any(c.isspace() for c in v) else "a word without spaces"


_FLAG = _int(0, 1)
_LEVEL = _words("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
# The settings people tune at scale (NCCL's env.html); others are refused rather than passed
# unchecked, so a typo is never silently a no-op.
NCCL_VARS = {
    "ALGO": _words("Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT", many=True),
    "PROTO": _words("LL", "LL128", "Simple", many=True),
    "BUFFSIZE": _int(65536),
    "NTHREADS": _int(64, 512),
    "MIN_NCHANNELS": _int(1, 64),
    "MAX_NCHANNELS": _int(1, 64),
    "NSOCKS_PERTHREAD": _int(1, 64),
    "SOCKET_NTHREADS": _int(1, 16),
    "SOCKET_IFNAME": _text,
    "IB_DISABLE": _FLAG,
    "IB_HCA": _text,
    "IB_GID_INDEX": _int(0, 255),
    "IB_TC": _int(0, 255),
    "IB_SL": _int(0, 15),
    "IB_TIMEOUT": _int(1, 31),
    "IB_RETRY_CNT": _int(0, 7),
    "IB_QPS_PER_CONNECTION": _int(1, 128),
    "IB_SPLIT_DATA_ON_QPS": _FLAG,
    "IB_ADAPTIVE_ROUTING": _FLAG,
    "IB_PCI_RELAXED_ORDERING": _int(0, 2),
    "NET_GDR_LEVEL": _LEVEL,
    "P2P_LEVEL": _LEVEL,
    "P2P_DISABLE": _FLAG,
    "SHM_DISABLE": _FLAG,
    "CROSS_NIC": _int(0, 2),
    "NVLS_ENABLE": _FLAG,
    "MNNVL_ENABLE": _int(0, 2),
    "CUMEM_ENABLE": _FLAG,
    "COLLNET_ENABLE": _FLAG,
    "DEBUG": _words("VERSION", "WARN", "INFO", "TRACE"),
    "DEBUG_SUBSYS": _text,
}

# Starting points per fabric; each entry says why. A preset is the first layer: --nccl
# settings given beside it override its entries.
NCCL_PRESETS: dict[str, dict[str, str]] = {
    # InfiniBand: GPUDirect RDMA up to the host bridge, several QPs per connection to spread
    # a connection's traffic over adaptive-routed paths
    "ib": {"IB_DISABLE": "0", "NET_GDR_LEVEL": "PHB", "IB_QPS_PER_CONNECTION": "4", "IB_ADAPTIVE_ROUTING": "1"},
    # RoCE v2: the RoCEv2 GID (index 3 on most Mellanox/NVIDIA NICs), a lossless traffic
    # class (106: DSCP 26 << 2 | ECN), and a longer timeout for a congested Ethernet fabric
    "roce": {"IB_DISABLE": "0", "IB_GID_INDEX": "3", "IB_TC": "106", "IB_TIMEOUT": "22", "NET_GDR_LEVEL": "PHB"},
    # GB200 NVL72: one NVLink domain across trays: NVLink SHARP and multi-node NVLink on, cuMem
    # allocations (which MNNVL needs)
    "nvl72": {"NVLS_ENABLE": "1", "MNNVL_ENABLE": "1", "CUMEM_ENABLE": "1"},
}


def _name(raw: str) -> str:
    key = raw.strip().upper()
    key = key[5:] if key.startswith("NCCL_") else key
    if key not in NCCL_VARS:
        near = difflib.get_close_matches(key, list(NCCL_VARS), n=1)
        hint = f" (did you mean NCCL_{near[0]}?)" if near else ""
        raise NcclError(
            f"--nccl: unknown setting {raw.strip()!r}{hint}; known: {', '.join(sorted(NCCL_VARS))} "
            "(with or without NCCL_)"
        )
    return key


def _pairs(text: str) -> list[tuple[str, str]]:
    """``"ALGO=Ring,Tree,PROTO=Simple"`` -> ``[("ALGO", "Ring,Tree"), ("PROTO", "Simple")]``."""
    out: list[tuple[str, str]] = []
    for tok in (t for t in re.split(r"[,\s]+", text.strip()) if t):
        if "=" in tok:
            k, v = tok.split("=", 1)
            out.append((k, v))
        elif out:
            out[-1] = (out[-1][0], f"{out[-1][1]},{tok}")
        else:
            raise NcclError(f"--nccl {text!r}: expected NAME=VALUE pairs, e.g. ALGO=Ring,PROTO=Simple")
    return out


def nccl_env(settings: str | None = None, preset: str | None = None) -> dict[str, str]:
    """The ``NCCL_*`` variables for ``--nccl`` text and/or ``--nccl-preset``; :class:`NcclError`
    (one message) on the first bad name or value."""
    env: dict[str, str] = {}
    if preset is not None:
        if preset not in NCCL_PRESETS:
            raise NcclError(f"--nccl-preset {preset!r} is not one of {', '.join(NCCL_PRESETS)}")
        env.update({f"NCCL_{k}": v for k, v in NCCL_PRESETS[preset].items()})
    for raw, value in _pairs(settings or ""):
        key = _name(raw)
        wrong = NCCL_VARS[key](value)
        if wrong:
            raise NcclError(f"--nccl NCCL_{key}={value!r}: NCCL expects {wrong}")
        env[f"NCCL_{key}"] = value
    lo, hi = env.get("NCCL_MIN_NCHANNELS"), env.get("NCCL_MAX_NCHANNELS")
    if lo and hi and int(lo) > int(hi):
        raise NcclError(f"--nccl MIN_NCHANNELS={lo} is above MAX_NCHANNELS={hi}")
    socks, threads = int(env.get("NCCL_NSOCKS_PERTHREAD", 1)), int(env.get("NCCL_SOCKET_NTHREADS", 1))
    if socks * threads > 64:
        raise NcclError(f"--nccl NSOCKS_PERTHREAD x SOCKET_NTHREADS = {socks * threads}: NCCL allows at most 64")
    return env
