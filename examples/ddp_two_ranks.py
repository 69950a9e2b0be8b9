"""Data-parallel training of a tiny GPT on two CPU ranks, from a script.

    python examples/ddp_two_ranks.py [--steps 60]

Each rank builds the same model (same seed), wraps it with DDP through
``workbench.strategies.prepare`` and trains on its half of every global batch of the
``copy`` task. DDP all-reduces the gradients, so the ranks stay identical: the script
checks that, and that the loss went down.
"""

from __future__ import annotations

import argparse

import workbench


def train(steps: int, global_batch: int = 16) -> dict:
    """Runs ON each rank."""
    import torch

    from workbench import engine
    from workbench.models import GPT, GPTConfig, SyntheticDataset, batch_at
    from workbench.strategies import prepare

    torch.manual_seed(0)
    model = GPT(GPTConfig(dim=32, n_layers=1, n_heads=2, max_seq_len=16))
    prepared = prepare(model, lambda params: torch.optim.AdamW(params, lr=1e-2), "ddp")
    data = SyntheticDataset("copy", n=512, seq_len=12)
    losses = [
        prepared.train_step(batch_at(data, global_batch, step, dp_rank=engine.rank, dp_size=engine.world_size))
        for step in range(steps)
    ]
    checksum = sum(float(p.detach().double().sum()) for p in prepared.unwrap().parameters())
    return {"rank": engine.rank, "path": prepared.path, "losses": losses, "checksum": checksum}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()

    workbench.start(2, threads=1)
    try:
        results = workbench.apply(train, args.steps)
    finally:
        left = workbench.stop()
    assert left == [], f"processes left behind: {left}"
    r0, r1 = results
    print(f"strategy path: {r0['path']}")
    print(f"loss: first {r0['losses'][0]:.3f}, last {r0['losses'][-1]:.3f} ({args.steps} steps)")
    assert r0["losses"] == r1["losses"], "the ranks report different (averaged) losses"
    assert abs(r0["checksum"] - r1["checksum"]) < 1e-6, "the ranks' weights drifted apart"
    assert r0["losses"][-1] < r0["losses"][0], "the loss did not go down"
    print("both ranks hold identical weights; the loss went down")


if __name__ == "__main__":
    main()
