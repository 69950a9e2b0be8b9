"""Simulated ranks for what this machine cannot hold: up to 1024 ranks' events and replies.

A SIMULATION (tests and benchmarks say so where they quote it): no rank processes run. What
the notebook side receives is real, though: step events made by ``shared.events.step_event``
(the ranks' own schema), encoded and HMAC-signed as ``engine.publisher`` does, pushed over
ZMQ into a real ``stream.Collector`` from a few publisher threads (one socket per simulated
host of ``per_host`` ranks, batches of one step of that host's ranks), at a chosen rate; and
replies of the shapes a cell and ``%distrain where`` produce (per-rank output, tracebacks,
faulthandler stacks) for the grouping code. Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import random
import threading
import time

from workbench.shared import events

RUN = "sim"


def step_metrics(rank: int, step: int, *, slow_ranks=(), nan_ranks=()) -> tuple[dict, dict]:
    """The metrics and comm fields of one rank's step, shaped like the trainer's."""
    base = 4.0 * math.exp(-step / 300) + 0.05 * math.sin(rank + step / 7)
    loss = float("nan") if rank in nan_ranks else base
    step_s = 0.25 * (3.0 if rank in slow_ranks else 1.0) * (1 + 0.02 * ((rank * 7919 + step) % 11) / 11)
    metrics = {
        "loss": 4.0 * math.exp(-step / 300),
        "loss_local": loss,
        "lr": 1e-3,
        "grad_norm": 1.0 + 1.0 / (1 + step),
        "tps": 2048 / step_s,
        "time_step_s": step_s,
        "time_data_s": 0.01,
        "time_forward_s": step_s * 0.3,
        "time_backward_s": step_s * 0.5,
        "time_optimizer_s": step_s * 0.1,
        "time_comm_wait_s": step_s * 0.09,
        "memory_rss_bytes": (900 + rank % 5) * 2**20,
    }
    comm = {"all_reduce": {"count": 2, "bytes": 4 * 2**20, "time_s": step_s * 0.09}}
    return metrics, comm


class SimulatedPublishers:
    """``n`` simulated ranks sending step events to ``collector`` (a real one) from threads.

    ``rate``: steps per second per rank (each step one event per rank). ``steps()`` sends a
    fixed number of steps as fast as the sockets take them; ``run_for(seconds)`` paces them.
    """

    def __init__(self, collector, n: int, *, per_host: int = 64, run: str = RUN, slow_ranks=(), nan_ranks=()):
        import zmq

        self.collector, self.n, self.run = collector, n, run
        self.slow_ranks, self.nan_ranks = set(slow_ranks), set(nan_ranks)
        self._ctx = zmq.Context()
        self.hosts = [list(range(lo, min(n, lo + per_host))) for lo in range(0, n, per_host)]
        self._socks = []
        for _ in self.hosts:
            sock = self._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.setsockopt(zmq.SNDHWM, 100_000)
            sock.connect(collector.address)
            self._socks.append(sock)
        self.sent = 0
        self.next_step = 0

    def _send(self, host: int, step: int, skip=()) -> None:
        batch = []
        for rank in self.hosts[host]:
            if rank in skip:
                continue
            metrics, comm = step_metrics(rank, step, slow_ranks=self.slow_ranks, nan_ranks=self.nan_ranks)
            batch.append(events.step_event(run=self.run, rank=rank, step=step, metrics=metrics, comm=comm))
        data = events.encode(batch)
        self._socks[host].send_multipart([hmac.new(self.collector.key, data, hashlib.sha256).digest(), data])
        self.sent += len(batch)

    def steps(self, count: int, *, skip=()) -> None:
        """``count`` steps of every rank but those in ``skip`` (a rank that lags)."""
        for _ in range(count):
            for host in range(len(self.hosts)):
                self._send(host, self.next_step, skip)
            self.next_step += 1

    def run_for(self, seconds: float, rate: float = 10.0) -> int:
        """Send ``rate`` steps per second per rank for ``seconds``, one thread per host; the
        number of events sent."""
        before = self.sent
        end = time.monotonic() + seconds
        first = self.next_step
        total = max(1, int(seconds * rate))

        def host_loop(host: int) -> None:
            for i in range(total):
                due = end - seconds + i / rate
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                self._send(host, first + i)

        threads = [threading.Thread(target=host_loop, args=(h,)) for h in range(len(self.hosts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.next_step = first + total
        return self.sent - before

    def close(self) -> None:
        for sock in self._socks:
            sock.close()
        self._ctx.term()


def wait_received(store, count: int, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if store.received >= count:
            return True
        time.sleep(0.01)
    return store.received >= count


# ------------------------------------------------------------------ replies, as ranks give them
COLLECTIVE_STACK = """Thread 0x{t:x} (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2801 in all_reduce
  File "/home/user/train.py", line 412 in train_step
  File "<ipython-input-7>", line 3 in <module>
"""
LOADER_STACK = """Thread 0x{t:x} (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 630 in __next__
  File "/home/user/train.py", line 405 in train_step
  File "<ipython-input-7>", line 3 in <module>
"""


def stacks(n: int, *, in_loader=()) -> dict[int, str]:
    """rank -> a faulthandler dump: most ranks in all_reduce, ``in_loader`` in the data loader."""
    return {r: (LOADER_STACK if r in in_loader else COLLECTIVE_STACK).format(t=0x7F00 + r) for r in range(n)}


def cell_replies(n: int, *, odd_ranks=(), failing=()) -> tuple[list, list, dict]:
    """(rest of stdout/stderr per rank, displays per rank, failures) of a cell on ``n`` ranks:
    every rank prints the same, ``odd_ranks`` print something else, ``failing`` raise alike."""
    rest = [
        ((f"loss {random.Random(r).random():.3f}\n" if r in odd_ranks else "step 100 done\n"), "") for r in range(n)
    ]
    failures = {r: ("ValueError", "bad batch", "Traceback...\nValueError: bad batch") for r in failing}
    return rest, [[] for _ in range(n)], failures


# ------------------------------------------------------------------ a rank set, as the registry sees it
class SimulatedRankSet:
    """What ``notebook.registry.entry_for`` reads of a rank set, for ``n`` simulated ranks on
    simulated hosts of ``per_host`` ranks (``sim-host-00``...): the Lab's server then lists them
    as it lists real ones on other hosts. No controller runs: its connection file does not exist."""

    def __init__(self, n: int, state_dir: str, *, per_host: int = 64, launcher: str = "ssh", backend: str = "gloo"):
        import types

        self.world_size = n
        self.engine_ids = list(range(n))
        self.info = [
            {"host": f"sim-host-{r // per_host:02d}", "pid": 100_000 + r, "device": "cpu", "backend": backend}
            for r in range(n)
        ]
        self.procs: list = []
        self.cluster = types.SimpleNamespace(cluster_id=f"sim{n}", profile_dir=state_dir)
        self.config = types.SimpleNamespace(launcher=launcher, backend=backend, n=n)
        self._dir = state_dir

    def _controller_pids(self) -> list[int]:
        return []

    def state_dir(self) -> str:
        return self._dir

    def announce(self, collector=None) -> str:
        """Write its registry entry, as a kernel does when its ranks are up; the entry's id.

        With ``collector`` (a real one, fed by :class:`SimulatedPublishers`) the entry names its
        event-stream mirror, as ``registry.announce`` does, so the Lab's server reads the steps."""
        from workbench.notebook import registry

        address = key = None
        if collector is not None:
            from workbench.notebook.stream.mirror import Mirror

            if collector.mirror is None:
                collector.mirror = Mirror()
            address, key = collector.mirror.address, collector.mirror.public_key
        entry = registry.entry_for(self, stream_address=address, stream_key=key)
        registry.write(entry)
        self.entry_id = entry["id"]
        return entry["id"]

    def kill(self, rank: int, exit: str = "killed by SIGKILL") -> None:
        """Report ``rank`` dead, through the call the kernel's watcher makes when a rank dies."""
        from workbench.notebook import registry

        registry._record_death(self.entry_id, {"rank": rank, "exit": exit, "exit_code": -9, "time": time.time()})

    def withdraw(self) -> None:
        from workbench.notebook import registry

        registry.remove(self.entry_id)


# ------------------------------------------------------------------ what pictures are drawn from
def timeline_records(n_ranks: int, steps: int, *, slow: int, fast: int) -> list[dict]:
    """Step records at the ranks' schema (engine.timeline): a synchronous step where every rank
    waits in its all_reduce for the slowest rank (the straggler)."""
    out = []
    work = {r: 0.10 + 0.0001 * r for r in range(n_ranks)}
    work[slow], work[fast] = 0.30, 0.05
    for step in range(steps):
        end = max(work.values()) + 0.01
        for r in range(n_ranks):
            w = work[r]
            spans = [
                {"name": "forward", "lane": "phase", "start": 0.0, "end": w / 2, "wait": False},
                {"name": "backward", "lane": "phase", "start": w / 2, "end": end, "wait": False},
                {"name": "all_reduce", "lane": "comm", "start": w, "end": end, "wait": True},
            ]
            out.append(
                {
                    "version": 1,
                    "run": "sim",
                    "rank": r,
                    "step": step,
                    "wall_start": 1000.0 + step * 0.4,
                    "duration": end,
                    "spans": spans,
                    "notes": [],
                }
            )
    return out


LAYOUT_ROWS, LAYOUT_COLS = 4096, 64


def layout_param(name: str, rows: list[list[int]], placements: list[str]) -> dict:
    held = sum(b - a for a, b in rows)
    return {
        "name": name,
        "global_shape": [LAYOUT_ROWS, LAYOUT_COLS],
        "local_shape": [held, LAYOUT_COLS],
        "placements": placements,
        "dtype": "float32",
        "local_bytes": held * LAYOUT_COLS * 4,
        "global_bytes": LAYOUT_ROWS * LAYOUT_COLS * 4,
        "holds": {"kind": "grid", "runs": [rows, [[0, LAYOUT_COLS]]], "partial": False},
    }


def layouts(strategy: str, n: int, replicate: int = 1) -> list[dict]:
    """Per-rank layouts (strategies.layout's schema): ddp (every rank whole), fsdp (rows split
    over all ranks) or hsdp (``replicate`` groups, rows split within each)."""
    shard = n // replicate
    out = []
    for r in range(n):
        if strategy == "ddp":
            rows, placements, mesh = [[0, LAYOUT_ROWS]], ["Replicate()"], {"shape": [n], "dim_names": ["dp"]}
        else:
            per = LAYOUT_ROWS // shard
            k = r % shard
            rows = [[k * per, (k + 1) * per]]
            placements = ["Replicate()", "Shard(0)"]
            mesh = {"shape": [replicate, shard], "dim_names": ["dp_replicate", "dp_shard"]}
        params = [layout_param(f"layers.{i}.weight", rows, placements) for i in range(3)]
        out.append({"version": 1, "strategy": strategy, "path": "native", "mesh": mesh, "rank": r, "params": params})
    return out
