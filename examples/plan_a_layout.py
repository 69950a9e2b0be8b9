"""Plan a large training run on paper: no ranks, no GPUs (the planner is pure arithmetic).

    python examples/plan_a_layout.py [--size 70b] [--gpus 256] [--hardware h100]

Prints the fastest layouts that fit in memory, then the full estimate for the best one.
"""

from __future__ import annotations

import argparse

from workbench.planner import ModelSpec, plan, recommend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="70b", help="Llama size preset (default 70b)")
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--hardware", default="h100")
    args = parser.parse_args()

    model = ModelSpec.llama(args.size)
    options = recommend(model, args.gpus, args.hardware, top=3)
    if not options:
        raise SystemExit(f"no layout of {args.gpus} x {args.hardware} fits Llama {args.size}")
    print(f"Llama {args.size} on {args.gpus} x {args.hardware}: the {len(options)} fastest layouts that fit")
    for rec in options:
        print(f"  {rec}")
    best = plan(model, options[0].plan.layout, args.hardware)
    print()
    print(best.summary())


if __name__ == "__main__":
    main()
