"""Entry point of ranks on this host: ``python -m workbench.engine.preload [--ranks N --exit-dir D] [ipengine args]``.

Imports torch and ipyparallel's engine first, then runs the engine. The engine would
otherwise sit idle while the controller writes its connection file and only then import
torch (the longest step of a rank's start); this way the two overlap.

With ``--ranks N`` this process imports once and forks N engines (the ranks), then stays
as their parent: it reaps each and writes its exit status to ``D/<pid>`` for the notebook,
which watches the ranks by pid but is not their parent. N ranks importing torch each cost
N times the CPU of one import, and on a machine with fewer cores than ranks that is most
of the start-up. Nothing in the import starts a thread or touches CUDA, so the forks are
as fresh as a new process.
"""

from __future__ import annotations

import os
import signal
import sys

import torch  # noqa: F401
import torch.distributed  # noqa: F401


def own_args(argv: list[str]) -> tuple[int | None, str | None, list[str]]:
    """``--ranks N`` and ``--exit-dir D`` taken out of the engine's arguments."""
    ranks = exit_dir = None
    rest: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg == "--ranks":
            ranks = int(next(it))
        elif arg == "--exit-dir":
            exit_dir = next(it)
        else:
            rest.append(arg)
    if ranks is not None and (ranks < 1 or exit_dir is None):
        raise SystemExit(f"--ranks needs a count >= 1 and --exit-dir, got --ranks {ranks} --exit-dir {exit_dir}")
    return ranks, exit_dir, rest


def main() -> None:
    ranks, exit_dir, rest = own_args(sys.argv[1:])
    sys.argv = [sys.argv[0], *rest]
    from ipyparallel.engine.app import main as engine_main

    if ranks is None:
        engine_main()
        return
    # interrupts are for the ranks (sent by pid); a Ctrl-C to the process group must not
    # end the parent that reports their exits
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pids = []
    for _ in range(ranks):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            _reseed()
            engine_main()
            return
        pids.append(pid)
    _reap(set(pids), exit_dir)


def _reseed() -> None:
    """A fork shares its parent's random state: give each rank its own, as a new process has.
    (``random`` reseeds itself at fork; torch's default generator has a fixed seed anyway.)"""
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _reap(pids: set[int], exit_dir: str) -> None:
    """Wait for every rank; write each one's exit status (negative: the signal) as soon as it ends."""
    os.makedirs(exit_dir, exist_ok=True)
    while pids:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        pids.discard(pid)
        tmp = os.path.join(exit_dir, f".{pid}")
        with open(tmp, "w") as f:
            f.write(str(os.waitstatus_to_exitcode(status)))
        os.replace(tmp, os.path.join(exit_dir, str(pid)))


if __name__ == "__main__":
    main()
