"""JAX on the workbench's ranks: ``%distrain start --framework jax`` on real forked ranks.

Four ranks each run ``jax.distributed.initialize`` (CPU collectives over gloo); a sharded
matmul whose contraction crosses ranks equals numpy's one-process product; the layout
picture (the same figure code as DTensor's) draws exactly the shards
``array.addressable_shards`` reports on each rank; a killed JAX rank is named.
"""

from __future__ import annotations

import re
import signal
import time

import numpy as np
import pytest

pytest.importorskip("jax")

from workbench.notebook import api  # noqa: E402
from workbench.notebook.cluster import RankDied  # noqa: E402
from workbench.notebook.commands import UsageError  # noqa: E402
from workbench.shared.ranges import parse_ranks  # noqa: E402

MATMUL = """
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jax.experimental import multihost_utils
from workbench import engine

mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("dp", "tp"))
rng = np.random.default_rng(0)
A = rng.standard_normal((8, 12)).astype(np.float32)
B = rng.standard_normal((12, 16)).astype(np.float32)
a = jax.make_array_from_callback(A.shape, NamedSharding(mesh, P("dp", "tp")), lambda i: A[i])
b = jax.make_array_from_callback(B.shape, NamedSharding(mesh, P("tp", None)), lambda i: B[i])
# the contraction dim is split over tp: each rank's partial products are summed across ranks
c = jax.jit(lambda x, y: x @ y, out_shardings=NamedSharding(mesh, P("dp", None)))(a, b)
full = np.asarray(multihost_utils.process_allgather(c, tiled=True))
layout = engine.describe_jax({"a": a, "b": b, "c": c}, strategy="jax 2x2")
shards = {
    name: [[(s.start or 0, s.stop if s.stop is not None else n) for s, n in zip(sh.index, arr.shape)]
           for sh in arr.addressable_shards]
    for name, arr in (("a", a), ("b", b), ("c", c))
}
"""


def test_four_jax_ranks_matmul_layout_picture_and_refusals(fresh_ranks, ipshell):
    # fresh_ranks stops every set started here (the magic's too) and checks no pid is left
    ipshell.run_line_magic("distrain", "start -n 4 --framework jax --threads 1 --session jx")
    rs = api.current()
    assert rs.config.framework == "jax" and rs.world_size == 4
    rs.execute(
        "import sys, jax\nfrom workbench import engine\n"
        "info = (engine.rank, engine.world_size, jax.process_index(), jax.device_count(), 'torch' in sys.modules)",
        timeout=60,
    )
    info = rs.pull("info")
    # rank = jax.process_index on every rank; 4 devices in all; torch never imported
    assert info == [(r, 4, r, 4, False) for r in range(4)]
    status = ipshell.run_line_magic("distrain", "status")
    assert list(status["framework"]) == ["jax"] * 4 and list(status["state"]) == ["idle"] * 4

    rs.execute(MATMUL, timeout=180)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((8, 12)).astype(np.float32)
    B = rng.standard_normal((12, 16)).astype(np.float32)
    for full in rs.pull("full"):
        np.testing.assert_allclose(full, A @ B, rtol=1e-5, atol=1e-5)

    # the picture: every block drawn is a shard some rank reported, labelled with exactly its ranks
    shards = rs.pull("shards")
    for name in ("a", "b", "c"):
        expected: dict = {}
        for rank, per_rank in enumerate(shards):
            for (r0, r1), (c0, c1) in per_rank[name]:
                expected.setdefault(((r0, r1), (c0, c1)), []).append(rank)
        fig = ipshell.run_line_magic("distrain", f"layout --tensor {name}")
        drawn = {}
        for shape, note in zip(fig.layout.shapes, fig.layout.annotations):
            ranks = parse_ranks(re.match(r"ranks? ([\d,-]+)", note.text).group(1), 1 << 20)  # "ranks 0-1,3"
            drawn[((int(shape.y0), int(shape.y1)), (int(shape.x0), int(shape.x1)))] = ranks
        assert drawn == {k: sorted(v) for k, v in expected.items()}, name
    heat = ipshell.run_line_magic("distrain", "layout")
    share = dict(zip(heat.data[0].y, heat.data[0].z))
    # a: 1/4 on each rank (2x2 blocks), b: half (split over tp, replicated over dp), c: half
    assert share == {"a": [0.25] * 4, "b": [0.5] * 4, "c": [0.5] * 4}
    layouts = rs.pull("layout")
    assert [lay["param_bytes_local"] for lay in layouts] == [(8 * 12 // 4 + 12 * 16 // 2 + 8 * 16 // 2) * 4] * 4
    assert layouts[0]["mesh"] == {"shape": [2, 2], "dim_names": ["dp", "tp"]}
    assert [p["placements"] for p in layouts[0]["params"]] == [
        ["Shard(0)", "Shard(1)"],
        ["Replicate()", "Shard(0)"],
        ["Shard(0)", "Replicate()"],
    ]

    # the planner's FSDP and TP arithmetic against the bytes each JAX rank holds of the same model
    from workbench.planner import ModelSpec, PlanLayout
    from workbench.planner.sharded_bytes import compare_param_bytes, shape_config

    model = ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, seq_len=32)
    rs.push({"cfg": shape_config(model)})
    plans = {"fsdp": PlanLayout(dp_shard=4, zero_stage=3, precision="fp32"), "tp": PlanLayout(tp=4, precision="fp32")}
    held = {}
    for style, plan in plans.items():
        rs.execute(
            "from workbench.engine.jax_models import llama_params\n"
            f"lay = engine.describe_jax(llama_params(cfg, {style!r}), strategy='jax {style}')",
            timeout=120,
        )
        rows = compare_param_bytes(rs.pull("lay"), model, plan)
        assert [r["ratio"] for r in rows] == [1.0] * 4, (style, rows)
        held[style] = rows[0]["measured_bytes"]
    # TP holds more than FSDP per rank: its norms are whole on every rank
    assert held["tp"] - held["fsdp"] == 4 * (2 * 2 * 64 + 64) * 3 // 4

    # torch's layouts on JAX ranks: refused, naming what to do; the ranks keep working
    with pytest.raises(UsageError, match=r"this rank set runs jax: shard with NamedSharding there"):
        ipshell.run_line_magic("distrain", "prepare ddp")
    with pytest.raises(Exception, match=r"runs jax .*--session NAME"):
        rs.execute("engine.prepare(None, None, 'ddp')", timeout=60)
    rs.execute("ones = float(jax.numpy.ones(3).sum())", timeout=60)
    assert rs.pull("ones") == [3.0] * 4


def test_bad_framework_settings_are_refused_before_any_start(fresh_ranks, ipshell):
    before = dict(api.sessions())
    with pytest.raises(UsageError, match=r"--backend nccl is torch's.*leave --backend out"):
        ipshell.run_line_magic("distrain", "start -n 2 --framework jax --backend nccl --session jbad")
    with pytest.raises(UsageError, match=r"--framework jax starts its ranks with --launcher local"):
        ipshell.run_line_magic("distrain", "start -n 2 --framework jax --launcher mpi --session jbad")
    assert dict(api.sessions()) == before and not fresh_ranks.started


def test_a_killed_jax_rank_is_named_restart_brings_jax_ranks_back_and_stop_leaves_nothing(fresh_ranks):
    rs = fresh_ranks(4, framework="jax")
    rs.execute("import jax; x = jax.numpy.arange(4)", timeout=60)
    pid = rs.procs[2].pid
    rs.signal_rank(2, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not rs.dead() and time.monotonic() < deadline:
        time.sleep(0.05)
    dead = rs.dead()
    assert [(d["rank"], d["pid"], d["exit"]) for d in dead] == [(2, pid, "killed by SIGKILL")]
    with pytest.raises(RankDied, match=r"rank 2 .*killed by SIGKILL"):
        rs.execute("x.sum()", timeout=60)
    # restart brings the set back as it was started: JAX ranks, every old process gone
    pids = list(rs.started_pids)
    again = api.restart()
    assert not [p for p in pids if _alive(p)]
    again.execute("import jax\nfrom workbench import engine\nwho = (engine.framework, jax.process_count())", timeout=60)
    assert again.pull("who") == [("jax", 4)] * 4
    pids = list(again.started_pids)
    assert api.stop() == []
    assert not [p for p in pids if _alive(p)]


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
