"""The workbench from a plain Python script: no notebook, no magics.

    python examples/api_without_magics.py [-n 2]

Everything ``%distrain`` does is a function in ``workbench``: ``start``, ``run``,
``apply``, ``push``, ``pull``, ``status`` and ``stop``. Ranks are stopped at the end,
and also if anything in between fails.
"""

from __future__ import annotations

import argparse

import workbench


def rank_and_sum(scale: float) -> dict:
    """Runs ON each rank (sent by ``workbench.apply``): an all_reduce, returned as data."""
    import torch
    import torch.distributed as dist

    from workbench import engine

    t = torch.tensor([float(engine.rank + 1)], device=engine.device) * scale  # NCCL ranks: on the GPU
    dist.all_reduce(t)
    return {"rank": engine.rank, "world_size": engine.world_size, "sum": t.item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2, help="number of ranks (default 2)")
    n = parser.parse_args().n

    rs = workbench.start(n, threads=1)
    try:
        print(f"{rs.world_size} ranks up in {rs.start_seconds:.1f} s")
        for row in workbench.status():
            print(f"  rank {row['rank']}: pid {row['pid']} on {row['host']} ({row['device']}, {row['backend']})")

        # 1. run code on every rank; output comes back tagged [rank N]
        workbench.run("from workbench import engine\nsteps = 0\nprint('hello from rank', engine.rank)")

        # 2. call a function on every rank; results come back in rank order
        results = workbench.apply(rank_and_sum, 0.5)
        expected = 0.5 * n * (n + 1) / 2
        assert [r["rank"] for r in results] == list(range(n)), results
        assert all(r["sum"] == expected for r in results), results
        print(f"all_reduce through apply: every rank has {expected:g}")

        # 3. push a value, change state on the ranks, pull it back
        workbench.push({"increment": 3})
        workbench.run("steps += increment * (engine.rank + 1)", display=False)
        steps = workbench.pull("steps")
        assert steps == [3 * (r + 1) for r in range(n)], steps
        print(f"pulled steps: {steps}")

        # 4. only some ranks
        workbench.run("print('only here')", ranks="0")
    finally:
        left = workbench.stop()
    assert left == [], f"processes left behind: {left}"
    print("ranks stopped")


if __name__ == "__main__":
    main()
