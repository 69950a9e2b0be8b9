"""What the server extension knows about rank sets: registry entries, rank state, a stream copy.

The Jupyter server reads the registry (:mod:`workbench.notebook.registry`) each time the sidebar
asks, looks at the rank processes itself (psutil: alive, stopped, memory), asks the rank
set's ipyparallel controller which ranks are busy, and keeps, per rank set, a reader of the
kernel's event-stream mirror (:mod:`workbench.notebook.stream.mirror`). None of this goes through
the owning kernel, so it answers while that kernel runs a cell.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import threading
import time
from collections import deque

import psutil

from ..notebook import registry

# A rank is marked a straggler when its trainer is this many steps behind the furthest rank
# and its latest step was taken this long (rank clocks) before the furthest rank's: ranks that
# agree every step differ by a step or two within one 0.1 s event batch, not a straggler.
STRAGGLER_STEPS = 2
STRAGGLER_S = 1.0


class StreamReader:
    """Subscribes to one rank set's mirror; keeps its events (bounded) and tells listeners."""

    def __init__(self, address: str, server_key: str, max_events: int = 100_000):
        self.address, self.server_key = address, server_key
        self.events: deque = deque(maxlen=max_events)
        self.last: dict[int, dict] = {}  # rank -> {step, loss, state, run}
        self.live = False  # the history has arrived
        self.lock = threading.Lock()
        self.listeners: set = set()  # fn(batch) called on the reader's thread
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workbench-lab-stream", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import zmq

        from ..notebook.stream.mirror import BYE, SUBSCRIBE

        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        public, secret = zmq.curve_keypair()
        sock.curve_serverkey = self.server_key.encode()
        sock.curve_publickey, sock.curve_secretkey = public, secret
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.connect(self.address)
        sock.send(SUBSCRIBE)
        try:
            while not self._stop.is_set():
                if not sock.poll(200):
                    continue
                while True:
                    try:
                        data = sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._add(json.loads(data))
            try:
                sock.send(BYE, zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        finally:
            sock.close(linger=0)
            ctx.term()

    def _add(self, batch: list[dict]) -> None:
        if not batch:
            self.live = True
            return
        with self.lock:
            for e in batch:
                if e.get("kind") not in ("step", "status"):
                    continue
                self.events.append(e)
                last = self.last.setdefault(e["rank"], {})
                if e["kind"] == "step" and e.get("source") == "trainer":
                    last.update(
                        run=e["run"],
                        step=e["step"],
                        loss=e["metrics"].get("loss"),
                        loss_local=e["metrics"].get("loss_local"),
                        time=e["time"],
                    )
                elif e["kind"] == "step":  # engine.report / the HF callback: a step, a loss when logged
                    last.update(run=e["run"], step=e["step"], time=e["time"])
                    if e["metrics"].get("loss") is not None:
                        last.update(loss=e["metrics"]["loss"], loss_local=e["metrics"].get("loss_local"))
                elif e["kind"] == "status":
                    last.update(run=e["run"], state=e["state"], reason=e.get("reason", ""))
            listeners = list(self.listeners)
        for fn in listeners:
            fn(batch)

    def history(self) -> list[dict]:
        with self.lock:
            return list(self.events)

    def close(self) -> None:
        self._stop.set()


class Controllers:
    """One ipyparallel Client per rank set, used from one thread of its own (Clients are not thread-safe)."""

    def __init__(self):
        self._clients: dict[str, tuple[str, object, concurrent.futures.ThreadPoolExecutor]] = {}
        self._lock = threading.Lock()

    def call(self, entry: dict, fn, timeout: float = 10.0):
        """Run ``fn(client)`` on the rank set's controller thread; wait at most ``timeout``."""
        with self._lock:
            held = self._clients.get(entry["id"])
            if held is None or held[0] != entry["connection_file"]:
                pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="workbench-lab-ipp")
                held = self._clients[entry["id"]] = [entry["connection_file"], None, pool]

        def run():
            if held[1] is None:
                import ipyparallel as ipp

                held[1] = ipp.Client(entry["connection_file"], timeout=5)
            return fn(held[1])

        return held[2].submit(run).result(timeout)

    def forget(self, entry_id: str) -> None:
        with self._lock:
            held = self._clients.pop(entry_id, None)
        if held is not None:

            def close():
                if held[1] is not None:
                    try:
                        held[1].close()
                    except Exception:
                        pass

            held[2].submit(close)
            held[2].shutdown(wait=False)


def gpu_usage() -> dict[int, dict] | None:
    """pid -> GPU memory (MB) and its device's utilisation (%), via NVML; None where NVML is absent."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver / no GPU: nothing to show, nothing broken
        return None
    out: dict[int, dict] = {}
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = proc.usedGpuMemory
                out[proc.pid] = {"device": i, "memory_mb": round(used / 2**20, 1) if used else None, "util": util}
    except Exception:
        return out
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out


class Monitor:
    """The server extension's view of every rank set in the registry."""

    def __init__(self, root_dir: str | None = None):
        self.root_dir = os.path.realpath(root_dir) if root_dir else None
        self.readers: dict[str, StreamReader] = {}
        self.controllers = Controllers()
        self.gone: dict[str, dict] = {}  # stale entries cleaned, shown for a while
        self._lock = threading.Lock()

    def entries(self) -> list[dict]:
        """Registry entries; stale ones are removed from disk and kept in view for a minute."""
        now = time.time()
        out = []
        for entry in registry.read_all():
            if entry["stale"]:
                registry.remove(entry["id"])
                entry["cleaned"] = now
                self.gone[entry["id"]] = entry
                continue
            out.append(entry)
        live = {e["id"] for e in out}
        for eid in list(self.readers):
            if eid not in live:
                self.readers.pop(eid).close()
                self.controllers.forget(eid)
        for eid, e in list(self.gone.items()):
            if now - e["cleaned"] > 60:
                del self.gone[eid]
        return out + [e for e in self.gone.values() if e["id"] not in live]

    def entry(self, entry_id: str) -> dict | None:
        entry = registry.read(entry_id)
        return entry if entry is not None and not entry["stale"] else None

    def reader(self, entry: dict) -> StreamReader | None:
        stream = entry.get("stream") or {}
        if not stream.get("address") or entry.get("stale") or entry.get("stopped_by"):
            return None
        with self._lock:
            r = self.readers.get(entry["id"])
            if r is None or r.address != stream["address"]:
                if r is not None:
                    r.close()
                r = self.readers[entry["id"]] = StreamReader(stream["address"], stream["server_key"])
            return r

    def queues(self, entry: dict) -> dict:
        """Engine id -> queue length from the controller ({} when it cannot be asked now)."""
        try:
            q = self.controllers.call(entry, lambda c: c.queue_status(verbose=False), timeout=3.0)
        except Exception:
            return {}
        return {k: v for k, v in q.items() if isinstance(k, int)}

    def describe(self, entry: dict) -> dict:
        """The sidebar's view of one rank set: the entry plus per-rank state, memory and trainer."""
        here = socket.gethostname()
        stopped = entry.get("stopped_by")
        queue = entry.get("queue")
        gone = entry.get("stale") or stopped or queue
        reader = None if gone else self.reader(entry)
        last = dict(reader.last) if reader is not None else {}
        queues = {} if gone else self.queues(entry)
        deaths = entry.get("deaths") or {}
        steps = [v["step"] for v in last.values() if "step" in v]
        top = max(steps) if steps else None
        newest = max((v["time"] for v in last.values() if "time" in v), default=None)
        gpus = None if gone else gpu_usage()
        ranks = []
        for r in entry["ranks"]:
            row = {k: r.get(k) for k in ("rank", "host", "pid", "device", "engine_id")}
            row.update(state="?", exit="", memory_mb=None, gpu=None)
            t = last.get(r["rank"], {})
            row["trainer"] = {k: t.get(k) for k in ("run", "state", "step", "loss")}
            row["straggler"] = bool(
                top is not None
                and "step" in t
                and top - t["step"] >= STRAGGLER_STEPS
                and newest - t["time"] >= STRAGGLER_S
            )
            death = deaths.get(str(r["rank"]))
            if queue:  # no process yet: Slurm has not given the allocation (or it is starting)
                row["state"] = "queued" if queue.get("state") == "PENDING" else "starting"
            elif death:
                row.update(state="dead", exit=death.get("exit", ""))
            elif r.get("host") == here:
                row.update(self._process(r["pid"]))
                row["gpu"] = gpus.get(int(r["pid"])) if gpus else None
            else:
                row["state"] = "remote"
            if row["state"] in ("running", "remote"):
                q = queues.get(r.get("engine_id"), {})
                if not queues:
                    row["state"] = "unknown" if row["state"] == "running" else "remote"
                else:
                    row["state"] = "busy" if (q.get("queue", 0) or q.get("tasks", 0)) else "idle"
                if t.get("state") == "paused":
                    row["state"] = "paused"
            if stopped and row["state"] != "dead":
                row["state"] = "ended"
            ranks.append(row)
        out = {
            k: entry.get(k)
            for k in (
                "id",
                "kernel_id",
                "kernel_pid",
                "notebook",
                "launcher",
                "backend",
                "world_size",
                "started",
                "host",
                "stopped_by",
                "job_id",
                "detached",  # held by a keeper process that outlives its kernel (%distrain detach)
                "keeper_pid",
                "name",
                "run",  # the session's current run: id, kind, state, its status head line
            )
        }
        out["notebook_path"] = self._relative(entry.get("notebook"))
        out["stale"] = bool(entry.get("stale"))
        if out["stale"] or stopped:
            out["state"] = "stale" if out["stale"] else "stopped"
        elif queue:  # the allocation is pending, or granted with its ranks still registering
            out["state"] = "queued" if queue.get("state") == "PENDING" else "starting"
        else:
            out["state"] = "running"
        out["queue"] = (
            {k: queue.get(k) for k in ("job_id", "state", "reason", "nodes")} if queue and not out["stale"] else None
        )
        out["ranks"] = ranks
        out["stream"] = bool(entry.get("stream"))
        out["step"] = top
        losses = [last[k].get("loss") for k in last if last[k].get("loss") is not None]
        out["loss"] = (sum(losses) / len(losses)) if losses else None
        return out

    def _relative(self, path: str | None) -> str | None:
        """The notebook's path as the Lab opens it (relative to the server's root), if it is under it."""
        if not path:
            return None
        if not os.path.isabs(path):
            return path
        if self.root_dir is None:
            return None
        rel = os.path.relpath(os.path.realpath(path), self.root_dir)
        return None if rel.startswith("..") else rel.replace(os.sep, "/")

    @staticmethod
    def _process(pid) -> dict:
        try:
            proc = psutil.Process(int(pid))
            status = proc.status()
            if status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                return {"state": "dead", "exit": "exited (status not yet read by its kernel)"}
            mem = round(proc.memory_info().rss / 2**20, 1)
            if status == psutil.STATUS_STOPPED:
                return {"state": "stopped", "memory_mb": mem}
            return {"state": "running", "memory_mb": mem}
        except (psutil.NoSuchProcess, TypeError, ValueError):
            return {"state": "dead", "exit": "exited (status not yet read by its kernel)"}

    def close(self) -> None:
        for r in self.readers.values():
            r.close()
        for eid in list(self.controllers._clients):
            self.controllers.forget(eid)
