"""Planner layouts as real DeviceMeshes at 64-1024 ranks, on the fake process group.

The fake backend (torch.testing._internal.distributed.fake_pg) lets one process play
one rank of a large world without any communication. It is initialised in a child
process so the global default process group never leaks into the pytest process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from workbench.planner import PlanLayout

CHILD = textwrap.dedent("""
    import json, sys
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.distributed.device_mesh import init_device_mesh

    out = []
    for case in json.loads(sys.argv[1]):
        shape, names = tuple(case["shape"]), tuple(case["names"])
        world = 1
        for s in shape:
            world *= s
        for rank in case["ranks"]:
            dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
            mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
            out.append(dict(
                world=dist.get_world_size(), rank=mesh.get_rank(),
                shape=list(mesh.shape), names=list(mesh.mesh_dim_names),
                coordinate=list(mesh.get_coordinate()),
                sizes={n: mesh[n].size() for n in names},
                tp_group=mesh["tp"].mesh.tolist(),
            ))
            dist.destroy_process_group()
    print(json.dumps(out))
""")

LAYOUTS = [
    PlanLayout(tp=8, pp=2, dp_replicate=2, dp_shard=2, zero_stage=3),  # 64
    PlanLayout(tp=8, pp=8, dp_shard=4, zero_stage=1, microbatches=8),  # 256
    PlanLayout(tp=8, pp=4, dp_replicate=4, dp_shard=4, cp=2, zero_stage=3),  # 1024
]


def test_planner_layouts_build_device_meshes_on_fake_pg():
    cases = []
    for layout in LAYOUTS:
        w = layout.world_size
        cases.append(dict(shape=layout.mesh_shape(), names=layout.mesh_dim_names(), ranks=[0, 13, w // 2 + 5, w - 1]))
    assert [layout.world_size for layout in LAYOUTS] == [64, 256, 1024]
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cases)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 4 * len(LAYOUTS)
    for i, got in enumerate(results):
        layout = LAYOUTS[i // 4]
        assert got["world"] == layout.world_size
        assert tuple(got["shape"]) == layout.mesh_shape()
        assert tuple(got["names"]) == ("pp", "dp_replicate", "dp_shard", "cp", "tp")
        assert got["coordinate"] == list(layout.coordinate(got["rank"]).values())
        assert got["sizes"] == dict(zip(layout.mesh_dim_names(), layout.mesh_shape()))
        # tp is innermost: a rank's TP group is tp consecutive ranks, i.e. one node of 8
        tp_group = got["tp_group"]
        start = got["rank"] - got["rank"] % layout.tp
        assert tp_group == list(range(start, start + layout.tp))
        assert layout.stride("tp") == 1 and layout.stride("pp") == layout.world_size // layout.pp
