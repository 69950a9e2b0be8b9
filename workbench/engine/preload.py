"""Entry point of a rank on this host: ``python -m workbench.engine.preload [ipengine args]``.

Imports torch first, then runs ipyparallel's engine. The engine would otherwise sit idle
while the controller writes its connection file and only then import torch (the longest
step of a rank's start); this way the two overlap.
"""

from __future__ import annotations

import torch  # noqa: F401
import torch.distributed  # noqa: F401


def main() -> None:
    from ipyparallel.engine.app import main as engine_main

    engine_main()


if __name__ == "__main__":
    main()
