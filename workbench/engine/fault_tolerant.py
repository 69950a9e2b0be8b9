"""Rank side of ``--fault-tolerant``: each replica group trains under a torchft ``Manager``.

Not the workbench :class:`~.trainer.Trainer`: its agreement and DDP run over the whole set's
process group, which cannot lose a member and go on. Here a replica's ranks average over a
gloo group of their own and the replicas meet only through torchft's quorum, so the others
keep stepping while a lost replica heals from a live peer (docs/unattended.md). torch is
imported inside: the notebook names these functions without importing torch."""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
import traceback
import urllib.request

from ..shared import events
from ..shared.replies import EXIT_REPLICA_LOST
from . import publisher, runtime

_CURRENT: FaultTolerantRun | None = None


class FaultTolerantRun:
    """One replica group member's training loop (module doc); ``plan`` is the notebook's."""

    def __init__(self, plan: dict):
        from datetime import timedelta

        import torch
        from torch.distributed import PrefixStore, TCPStore
        from torchft import Manager, ProcessGroupGloo

        from ..models import GPT, GPTConfig, TextDataset

        ctx = runtime.context()
        self.plan = plan
        self.rank, self.world_size = ctx.rank, ctx.world_size
        g = int(plan["group_size"])
        self.replica, self.group_rank, self.group_size = self.rank // g, self.rank % g, g
        self.replicas = self.world_size // g
        self.run, self.sent_as = plan["run"], plan.get("send_as") or plan["run"]
        self.target = int(plan["target"])
        self.state, self.reason, self.step = "idle", "", 0
        self.quorum = 0
        self._stop = threading.Event()
        # set by the notebook when a lost replica's replacement failed: the last step is taken without it
        self._alone = threading.Event()
        self.waiting = False  # at the last step, for a lost replica to be back in the quorum
        # the last step's wait: its rounds (each re-forms the quorum and the replicas' gloo group) and seconds
        self.wait_rounds, self.wait_s = 0, 0.0
        self._wait_t0: float | None = None
        self._manager_down = False
        self.stopped_at: int | None = None  # `train stop`: the step every rank ends after (stop_at)
        timeout = timedelta(seconds=float(plan["collective_timeout"]))
        port = int(plan["store_ports"][self.replica])
        # the replica's own store: hosted by its group rank 0 (the Manager only connects to it)
        self._store = TCPStore(
            "127.0.0.1", port, g, is_master=self.group_rank == 0, timeout=timeout, wait_for_workers=False
        )
        self.inner = None
        if g > 1:  # gradients are averaged inside the replica first, over the replica's own group
            from torch.distributed import ProcessGroupGloo as GlooBackend

            self.inner = GlooBackend(PrefixStore("inner", self._store), self.group_rank, g, timeout)
        cfg = {"tiny": GPTConfig.tiny, "small": GPTConfig.small}[plan.get("model", "tiny")](max_seq_len=32)
        torch.manual_seed(int(plan.get("seed", 0)))
        self.model = GPT(cfg)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=float(plan.get("lr", 1e-3)))
        self.dataset = TextDataset(32)
        self.batch_size = int(plan.get("batch_size", 8))
        self.heals: list[int] = []  # the steps this member healed at (a replica that started late heals at once)
        self.pg = ProcessGroupGloo(timeout=timeout)  # sized to every replica of each step's quorum
        self.manager = Manager(
            pg=self.pg,
            load_state_dict=self._load,
            state_dict=self._state,
            min_replica_size=1,
            timeout=timeout,
            quorum_timeout=timedelta(seconds=float(plan["manager_quorum_timeout"])),
            connect_timeout=timedelta(seconds=60),
            rank=self.group_rank,
            world_size=g,
            store_addr="127.0.0.1",
            store_port=port,
            lighthouse_addr=plan["lighthouse"],
            replica_id=f"workbench_replica_{self.replica}",
            init_sync=False,  # every replica seeds its model alike; a replacement heals anyway
        )
        self._thread = threading.Thread(target=self._loop, name="workbench-ft-train", daemon=True)

    # torchft asks for the replica's state to send to a healing peer, and loads what it got
    def _state(self) -> dict:
        return {"model": self.model.state_dict(), "optim": self.optim.state_dict()}

    def _load(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optim.load_state_dict(state["optim"])
        self.heals.append(self.manager.current_step())  # torchft set the step it healed to first

    def _set_state(self, state: str, reason: str = "") -> None:
        self.state, self.reason = state, reason
        publisher.emit(
            events.status_event(run=self.sent_as, rank=self.rank, state=state, step=self.step, reason=reason)
        )

    def _loop(self) -> None:
        try:
            self._set_state("running")
            while not self._stop.is_set() and self.manager.current_step() < self.target:
                if self._one_step() is None:  # the last step, with a replica away: again once one asks to join
                    self._wait_for_a_joiner()
                if self.plan.get("send_as") and not self.heals and self.manager.current_step() > 0:
                    # a replacement alone in its first quorum: no live peer held the run's state
                    self._end_manager()
                    self._set_state(
                        "stopped",
                        f"replica {self.replica} came back with no live replica to heal from (the others had "
                        "finished or were lost): it did not train on from its fresh weights",
                    )
                    return
            publisher.flush(10.0)
            self._end_manager()
            self._set_state("stopped" if self._stop.is_set() or self.stopped_at is not None else "finished")
        except Exception as exc:
            # a lost member of this replica, or a torchft call that failed: the replica cannot step on.
            # This process ends itself: its peers in the other replicas stop waiting on it at once
            # (their collective errors), and the notebook replaces the replica as it does a dead one.
            self._set_state("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}")
            publisher.flush(10.0)
            os._exit(EXIT_REPLICA_LOST)
        finally:
            publisher.flush(10.0)

    def _end_manager(self) -> None:
        """The run is over on this rank: end its Manager, so that its replica stops heartbeating the
        lighthouse (a replacement would otherwise wait for it there for good). The replica's ranks
        end together: group rank 0's server answers the others' last commit first."""
        if self._manager_down:
            return
        self._manager_down = True
        if self.inner is not None and not self._stop.is_set():  # (after close(), a peer may be a step behind)
            try:
                import torch

                self.inner.allreduce([torch.zeros(1)]).wait()
            except Exception:  # a peer of this replica is gone: nobody waits on this server
                pass
        try:
            self.manager.shutdown(wait=False)
        except Exception:
            pass

    def _wait_for_a_joiner(self) -> None:
        """At the last step with a replica away: wait until a replica asks the lighthouse for a quorum
        (the lost one's replacement), then form it again. Each try re-forms the replicas' gloo group
        (a step that did not commit makes the lighthouse issue a new quorum), so rather than trying
        again and again, the lighthouse's status page is read (an HTTP GET) until a replica asks.
        Where it cannot be read, the tries back off (0.1 s doubling to 2 s)."""
        if self.plan.get("last_step_retry_s"):  # a fixed retry, which benchmarks/ft_last_step_bench.py compares
            time.sleep(float(self.plan["last_step_retry_s"]))
            return
        backoff = min(2.0, 0.1 * 2 ** max(0, self.wait_rounds - 1))
        t0 = time.monotonic()
        while not (self._stop.is_set() or self._alone.is_set() or self.stopped_at is not None):
            asking = self._lighthouse_participants()
            if asking is None and time.monotonic() - t0 >= backoff:
                return
            if asking:
                return
            time.sleep(0.1)

    def _lighthouse_participants(self) -> int | None:
        """How many replicas ask the lighthouse for a quorum now (None where its page cannot be read)."""
        try:
            with urllib.request.urlopen(self.plan["lighthouse"] + "/status", timeout=2.0) as r:
                page = r.read().decode(errors="replace")
        except Exception:
            return None
        m = re.search(r"\[(\d+)/(\d+) participants healthy\]", page)
        return int(m.group(2)) if m else None

    def _one_step(self) -> bool | None:
        """One step; whether it committed, None when it was the last and waits for a lost replica."""
        import torch

        from ..models import batch_at

        t0 = time.perf_counter()
        self.optim.zero_grad(set_to_none=False)
        self.manager.start_quorum()
        index = self.manager.current_step()  # the data follows the committed step: a healed replica goes on
        away = index == self.target - 1 and self._replica_away()
        x, y = batch_at(
            self.dataset, self.batch_size, index, dp_rank=self.rank % self.world_size, dp_size=self.world_size
        )
        logits = self.model(x)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        flat = torch.cat([g.flatten() for g in grads])
        if self.inner is not None:
            try:
                self.inner.allreduce([flat]).wait()
            except Exception as exc:  # this replica lost a rank: it cannot step again
                self.manager.report_error(exc)
                raise RuntimeError(f"replica {self.replica} lost a rank: {exc}") from exc
            flat /= self.group_size
        self.manager.allreduce(flat).wait()  # the mean over the replicas in this step's quorum
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        quorum = self.manager.num_participants()
        grad_norm = float(flat.norm())  # of the averaged gradient: the same on every rank that commits
        return self._finish_step(away, quorum, loss, grad_norm, x.numel(), t0, self.optim.step)

    def _finish_step(
        self, away: bool, quorum: int, loss, grad_norm: float, tokens: int, t0: float, apply
    ) -> bool | None:
        """A step's end, alike for every replica kind: at a last step that waits for a lost replica the
        step is taken in full (the others in the quorum wait on it) but not committed (None); else
        ``apply()`` (the optimizer step) when the quorum commits, and the step reported."""
        if self._wait_t0 is not None:  # a round of the last step's wait (_wait_for_a_joiner)
            self.wait_rounds += 1
            self.wait_s = time.perf_counter() - self._wait_t0
        if away:
            self.manager.report_error(RuntimeError("the last step waits for a lost replica"))
            self.manager.should_commit()  # False on every rank of this replica
            if self._wait_t0 is None:
                self._wait_t0, self.wait_rounds = t0, 1
            return None
        self.waiting = False
        committed = self.manager.should_commit()
        if committed:
            apply()
            seconds = time.perf_counter() - t0
            self.step, self.quorum = self.manager.current_step(), quorum
            publisher.emit(
                events.step_event(
                    run=self.sent_as,
                    rank=self.rank,
                    step=self.step,
                    metrics={
                        "loss": float(loss.detach()),
                        "quorum": quorum,
                        "replica": self.replica,
                        "grad_norm": grad_norm,
                        "time_step_s": seconds,
                        "tps": tokens / max(1e-9, seconds),  # this rank's tokens per second
                    },
                )
            )
        return committed

    def _replica_away(self) -> bool:
        """Whether this step's quorum lacks a replica (a healing one counts: it is in the quorum).
        A lost replica heals only in a step taken with the others, so the run's last step waits for
        its replacement; the ranks see the loss themselves, at once, before the notebook could tell
        them (a survivor already in its last step would otherwise finish alone, and a replacement
        would then find no quorum to join). Not after ``train stop``, nor once the notebook gave up
        on the replacement (:func:`finish_alone`)."""
        if self.stopped_at is not None or self._alone.is_set() or self._stop.is_set():
            return False
        self.manager.wait_quorum()
        if self.manager.errored() is not None:  # no quorum was configured: this step does not commit anyway
            return False
        self.waiting = self.pg.size() < self.replicas
        return self.waiting

    def start(self) -> dict:
        self._thread.start()
        return self.status()

    def status(self) -> dict:
        return {
            "run": self.run,
            "rank": self.rank,
            "replica": self.replica,
            "group_rank": self.group_rank,
            "state": self.state,
            "reason": self.reason,
            "step": self.step,
            "target": self.target,
            "quorum": self.quorum,
            "heals": list(self.heals),
            "waiting": self.waiting,
            "wait_rounds": self.wait_rounds,
            "wait_s": round(self.wait_s, 3),
        }

    def full_state(self) -> dict:
        """The whole model's state (a sharded replica gathers it: ``ShardedFaultTolerantRun``)."""
        return self.model.state_dict()

    def close(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if not self._manager_down:
            self._manager_down = True
            try:
                self.manager.shutdown(wait=False)
            except Exception:
                pass


class ShardedFaultTolerantRun(FaultTolerantRun):
    """``--strategy hsdp``: a replica shards its model over its own ranks (the dp_shard dimension), ZeRO-3
    style; the replicas are torchft replica groups (dp_replicate) as in ``ddp``.

    Between steps group rank ``i`` of a replica holds only shard ``i`` of the flat parameters (padded to a
    multiple of the group size) and its AdamW state; the model's own parameters are empty. A step all-gathers
    the parameters over the replica's gloo group, runs forward and backward, frees them, reduce-scatters the
    gradients inside the replica, averages its gradient shard with the same shard of the other replicas
    (``manager.allreduce``: torchft's group of a rank is the same group rank of every replica), and steps
    its shard. torchft heals a group rank from the same group rank of a live replica, so what it sends and
    loads is that rank's shard. Why not FSDP2's ``fully_shard``: it needs a ``DeviceMesh``, which takes a
    process group registered with the world group, and a replacement rank has none (docs/unattended.md).
    """

    def __init__(self, plan: dict):
        super().__init__(plan)
        import torch

        if self.inner is None:
            raise RuntimeError("a sharded replica needs 2 or more ranks per replica")
        self.params = list(self.model.parameters())  # tied weights once
        self._shapes = [p.shape for p in self.params]
        self.numel = sum(p.numel() for p in self.params)
        self.shard_numel = -(-self.numel // self.group_size)
        flat = torch.zeros(self.shard_numel * self.group_size)
        flat[: self.numel] = torch.cat([p.detach().flatten() for p in self.params])
        lo = self.group_rank * self.shard_numel
        self.shard = torch.nn.Parameter(flat[lo : lo + self.shard_numel].clone())
        self.optim = torch.optim.AdamW([self.shard], lr=float(plan.get("lr", 1e-3)))  # elementwise: as on the whole
        self.healed_numel: int | None = None  # the size of the shard a heal brought
        self._free()

    def _state(self) -> dict:
        return {"shard": self.shard.detach(), "optim": self.optim.state_dict()}

    def _load(self, state: dict) -> None:
        self.shard.data.copy_(state["shard"])
        self.optim.load_state_dict(state["optim"])
        self.healed_numel = state["shard"].numel()
        self.heals.append(self.manager.current_step())

    def _free(self) -> None:
        import torch

        for p in self.params:
            p.data, p.grad = torch.empty(0), None

    def _gather(self) -> None:
        """The whole parameters from every shard of the replica, as views of one flat buffer."""
        import torch

        full = torch.empty(self.shard_numel * self.group_size)
        self.inner._allgather_base(full, self.shard.detach()).wait()
        offset = 0
        for p, shape in zip(self.params, self._shapes):
            p.data = full[offset : offset + shape.numel()].view(shape)
            offset += shape.numel()

    def _one_step(self) -> bool | None:
        """As the ddp replica's step: whether it committed, None at a last step that waits for a lost replica."""
        import torch

        from ..models import batch_at

        t0 = time.perf_counter()
        self.manager.start_quorum()
        index = self.manager.current_step()
        away = index == self.target - 1 and self._replica_away()
        x, y = batch_at(
            self.dataset, self.batch_size, index, dp_rank=self.rank % self.world_size, dp_size=self.world_size
        )
        try:
            self._gather()
            logits = self.model(x)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
            loss.backward()
            flat = torch.zeros(self.shard_numel * self.group_size)
            offset = 0
            for p, shape in zip(self.params, self._shapes):
                n = shape.numel()
                if p.grad is not None:
                    flat[offset : offset + n] = p.grad.flatten()
                offset += n
            self._free()
            grad = torch.empty(self.shard_numel)
            self.inner._reduce_scatter_base(grad, flat).wait()  # the replica's sum of this rank's shard
        except Exception as exc:  # this replica lost a rank: it cannot step again
            self._free()
            self.manager.report_error(exc)
            raise RuntimeError(f"replica {self.replica} lost a rank: {exc}") from exc
        grad /= self.group_size
        self.manager.allreduce(grad).wait()  # the same shard's mean over the replicas in the quorum
        square = (grad * grad).sum().reshape(1)
        self.inner.allreduce([square]).wait()  # the whole gradient's norm: its shards' squares summed
        quorum = self.manager.num_participants()
        return self._finish_step(away, quorum, loss, float(square.sqrt()), x.numel(), t0, lambda: self._apply(grad))

    def _apply(self, grad) -> None:
        """The optimizer step on this rank's shard, with the replicas' mean gradient of it."""
        self.shard.grad = grad
        self.optim.step()
        self.shard.grad = None

    def held(self) -> dict:
        """The bytes this rank holds between steps: the model's parameters (none), its shard, its AdamW state."""
        optim = sum(
            t.numel() * t.element_size()
            for s in self.optim.state.values()
            for k, t in s.items()
            if k != "step" and hasattr(t, "numel")
        )
        return {
            "rank": self.rank,
            "model_param_bytes": sum(p.numel() * p.element_size() for p in self.model.parameters()),
            "shard_bytes": self.shard.numel() * self.shard.element_size(),
            "optim_bytes": optim,
            "full_param_bytes": self.numel * self.shard.element_size(),
            "shard_numel": self.shard_numel,
            "healed_numel": self.healed_numel,
        }

    def full_state(self) -> dict:
        """The whole model's state, gathered over the replica (every rank of it calls this together)."""
        self._gather()
        try:
            return {k: v.clone() for k, v in self.model.state_dict().items()}
        finally:
            self._free()


def start(plan: dict, begin: bool = True) -> dict:
    """Build this rank's replica member (its Manager then heartbeats the lighthouse) and, with
    ``begin``, start its loop in the background. The first start builds every rank before any
    begins: a replica that stepped alone while the others were still building would make them
    heal at once from it."""
    global _CURRENT
    if _CURRENT is not None and _CURRENT.state in ("running", "idle"):
        raise RuntimeError(f"rank {_CURRENT.rank}: a fault-tolerant run ({_CURRENT.run}) is already running")
    if _CURRENT is not None:  # the previous run's Manager: its servers and heartbeat end here
        _CURRENT.close(timeout=5.0)
    _CURRENT = None
    _CURRENT = (ShardedFaultTolerantRun if plan.get("strategy") == "hsdp" else FaultTolerantRun)(plan)
    return _CURRENT.start() if begin else _CURRENT.status()


def begin() -> dict:
    """Start the loop of the member :func:`start` built with ``begin=False``."""
    if _CURRENT is None or _CURRENT.state != "idle":
        raise RuntimeError("no fault-tolerant run built on this rank to begin")
    return _CURRENT.start()


def status() -> dict:
    return {"state": "none", "step": 0} if _CURRENT is None else _CURRENT.status()


def stop(timeout: float = 30.0) -> dict:
    """Stop at the next step and end the Manager (its server, the checkpoint transport)."""
    if _CURRENT is None:
        return status()
    _CURRENT.close(timeout)
    return _CURRENT.status()


def stop_at(step: int) -> dict:
    """End the loop after ``step`` (``train stop``): the notebook gives every rank the same step, a little
    past the newest, so that the ranks of a replica end together (one that stopped a step before its
    peer would leave it waiting in the replica's collective)."""
    if _CURRENT is None:
        return status()
    _CURRENT.stopped_at = int(step)
    _CURRENT.target = min(_CURRENT.target, int(step))
    return _CURRENT.status()


def finish_alone() -> dict:
    """A lost replica will not be back (its replacement failed): take the last step without it."""
    if _CURRENT is None:
        return status()
    _CURRENT._alone.set()
    return _CURRENT.status()


def weights_digest() -> dict:
    """A hash of the model's parameters and the step: equal on ranks that hold the same weights (a sharded
    replica gathers them: all its ranks call this together, as ``rs.apply`` does)."""
    if _CURRENT is None:
        raise RuntimeError("no fault-tolerant run on this rank")
    h = hashlib.sha256()
    for name, t in sorted(_CURRENT.full_state().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return {"rank": _CURRENT.rank, "step": _CURRENT.manager.current_step(), "digest": h.hexdigest()}


def held() -> dict:
    """What a sharded replica's rank holds between steps, in bytes (``ShardedFaultTolerantRun.held``)."""
    if not isinstance(_CURRENT, ShardedFaultTolerantRun):
        raise RuntimeError("no sharded (--strategy hsdp) fault-tolerant run on this rank")
    return _CURRENT.held()
