"""Torchft replica groups (``train start --fault-tolerant``): survivors keep training.

The ranks form replica groups of consecutive ranks, each training under a torchft ``Manager``
(``engine.fault_tolerant``); a lighthouse process of the set forms a quorum every step. When a
rank dies the other replicas step on without it, and a :class:`FaultTolerantRun` thread replaces
the lost replica's ranks on the same controller (``cluster.replacements``); torchft heals them
from a live peer and they rejoin. Each replacement is a record in the store; how it decides:
docs/unattended.md."""

from __future__ import annotations

import os
import threading
import time

from ...engine import rpc
from ...shared.replies import EXIT_REPLICA_LOST
from .. import stream
from ..cluster import lighthouse, network, replacements
from .contract import Run, register
from .part import begin

# replicated layouts whose replicas can run as torchft replica groups here; hsdp: each replica sharded over its ranks
STRATEGIES = ("ddp", "hsdp")
SETTLE_S = 30.0  # how long its end waits for the ranks' loops to be gone
AFTER_THE_END = "died after the end"  # the kind of a record of a death once every replica took the last step


def check(rs, *, strategy: str, replicas: int, quorum_timeout: float, steps: int) -> int:
    """Refuse what cannot run fault-tolerant, before anything starts; returns the group size."""
    name = (strategy or "ddp").split()[0].lower()
    if name not in STRATEGIES:
        raise ValueError(
            f"--fault-tolerant runs a replicated layout: --strategy ddp or hsdp, not {strategy!r} "
            "(tensor, pipeline and fully sharded layouts have no replica to lose); nothing was started"
        )
    if (strategy or "ddp").strip().lower() != name:
        raise ValueError(
            f"--fault-tolerant takes --strategy {name} without options (got {strategy!r}): --replicas R sets the "
            "replica groups (hsdp's dp_replicate), the ranks of each shard it (dp_shard); nothing was started"
        )
    if lighthouse.binary() is None:
        raise ValueError(f"--fault-tolerant needs torchft: {lighthouse.NOT_INSTALLED}; nothing was started")
    replacements.check_replaceable(rs)
    backend = rs.info[0].get("backend") if rs.info else None
    if backend != "gloo":
        raise ValueError(
            f"--fault-tolerant runs on gloo ranks here (these use {backend}): start with --backend gloo; nothing was started"
        )
    n = rs.world_size
    if not isinstance(replicas, int) or replicas < 2 or n % replicas:
        ok = [r for r in range(2, n + 1) if n % r == 0]
        raise ValueError(
            f"--replicas {replicas} does not split {n} ranks into equal replica groups of 2 or more replicas: "
            f"use one of {ok or '(none: start at least 2 ranks)'}; nothing was started"
        )
    if name == "hsdp" and n // replicas < 2:
        ok = [r for r in range(2, n // 2 + 1) if n % r == 0]
        raise ValueError(
            f"--strategy hsdp shards each replica over its ranks: --replicas {replicas} leaves {n // replicas} rank "
            f"per replica; use one of {ok or '(none: start at least 4 ranks)'}, or --strategy ddp; nothing was started"
        )
    if not quorum_timeout or quorum_timeout <= 0:
        raise ValueError(f"--quorum-timeout must be a positive number of seconds, got {quorum_timeout!r}")
    if steps < 1:
        raise ValueError(f"--steps must be at least 1, got {steps}")
    return n // replicas


def describe(rec: dict) -> str:
    """One line of a replica replacement (``train status``, the dashboard)."""
    detail = (rec.get("detail") or "").splitlines()[0][:200] if rec.get("detail") else ""
    if rec.get("kind") == AFTER_THE_END:
        return (
            f"replica {rec['replica']} lost rank {rec['rank']} (host {rec['host']}) after the run's last step "
            f"({rec['failed_step']}): {detail}; not replaced, the run had taken all its steps"
        )
    head = (
        f"replacement {rec['n']}: replica {rec['replica']} lost rank {rec['rank']} (host {rec['host']}) "
        f"at step {rec['failed_step']}: {detail}"
    )
    if rec.get("error"):
        return (
            f"{head}; the replacement failed: {rec['error']}; the other replicas finished alone "
            f"(replica {rec['replica']} left out)"
        )
    ranks = f"ranks {rec['ranks'][0]}-{rec['ranks'][-1]}" if len(rec["ranks"]) > 1 else f"rank {rec['ranks'][0]}"
    out = f"{head}; {ranks} restarted in {rec['restart_s']:.1f} s"
    if rec.get("checkpoint_step") == 1 and (rec.get("failed_step") or 0) > 1:
        # its first step was the run's first: no live peer was there to heal from
        out += f", found no live peer and started over from step 1, {rec['rejoined_s']:.1f} s after the failure"
    elif rec.get("checkpoint_step") is not None:
        out += (
            f", healed from a live peer and rejoined at step {rec['checkpoint_step']}, "
            f"{rec['rejoined_s']:.1f} s after the failure"
        )
    else:
        out += ", healing from a live peer"
    return out


@register
class FaultTolerantRun(Run):
    """One fault-tolerant run of ``sess``'s ranks and the thread that replaces lost replicas."""

    kind = "fault-tolerant"
    controls = ()  # its ranks run a loop of their own: the workbench trainer's controls do not reach it
    cannot_carry = (
        "a fault-tolerant run cannot move to a keeper while it trains: its torchft lighthouse ends with "
        "this kernel; `%distrain train stop` it (or wait for it) first"
    )

    def __init__(
        self,
        sess,
        steps: int,
        *,
        replicas: int,
        quorum_timeout: float,
        strategy: str = "ddp",
        model: str = "tiny",
        batch_size: int = 8,
        lr: float = 1e-3,
        seed: int = 0,
        poll: float = 0.2,
    ):
        rs = sess.rankset
        self.sess, self.rankset, self.poll = sess, rs, poll
        self.replicas, self.group_size = replicas, rs.world_size // replicas
        self.strategy = (strategy or "ddp").strip().lower()  # hsdp: each replica sharded over its ranks
        self.quorum_timeout = float(quorum_timeout)
        self._state = "starting"
        self.stopping = False  # `train stop`: the ranks end at one step; a rank that ends then is not replaced
        self.error = ""
        self.left_out: dict[int, str] = {}  # replica -> why it is out of the run (its replacement failed)
        self._settled: set[int] = set()  # pids of dead ranks already dealt with (replaced ones leave the watcher)
        self._ended_dead: set[int] = set()  # ranks that died after the run's last step
        self._undecided_since: float | None = None  # a death while a live rank was inside the last step
        self._stop = threading.Event()
        self.done = threading.Event()
        collector = stream.attach(rs)
        if rs.lighthouse is not None:  # the previous fault-tolerant run's
            rs.lighthouse.stop()
        rs.lighthouse = lighthouse.Lighthouse(
            min_replicas=1,
            quorum_timeout_s=self.quorum_timeout,
            log_path=os.path.join(rs.state_dir(), "lighthouse.log"),
        )
        rs.started_pids.append(rs.lighthouse.pid)  # ended with the set, like the controller
        self.run_id = f"ft-{time.strftime('%Y%m%d-%H%M%S')}-{int(time.time() * 1000) % 1000:03d}"
        self.target = int(steps)
        self.plan = {
            "run": self.run_id,
            "target": self.target,
            "group_size": self.group_size,
            "strategy": self.strategy,
            "lighthouse": rs.lighthouse.address,
            "store_ports": {r: network.free_port() for r in range(replicas)},
            # a collective with a lost peer errors at once on gloo (and a rank whose replica lost a
            # member ends itself); torchft's calls that wait on a live but slow peer (should_commit
            # waits for every rank of the replica) give up after this: generous on a loaded machine
            "collective_timeout": max(30.0, 2 * self.quorum_timeout),
            "manager_quorum_timeout": 4 * self.quorum_timeout + 60.0,
            "model": model,
            "batch_size": batch_size,
            "lr": lr,
            "seed": seed,
        }
        self.generation = dict.fromkeys(range(replicas), 0)
        begin(sess, self.run_id, len(collector.store.statuses))
        replacements.spare(rs)  # its imports overlap the ranks' build: it is ready sooner for a failure
        rs.apply(rpc.handle, rpc.StartFaultTolerant(plan=self.plan, begin=False), timeout=300)  # every replica built,
        rs.apply(rpc.handle, rpc.BeginFaultTolerant(), timeout=60)  # then all step: none trains alone at the start
        self._state = "running"
        self._thread = threading.Thread(target=self._loop, name="workbench-fault-tolerance", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ reading
    @property
    def state(self) -> str:
        return self._state

    @property
    def store(self):
        return self.sess.store

    @classmethod
    def describe(cls, record: dict) -> str:
        return describe(record)

    @property
    def records(self) -> list[dict]:
        """The replacements (a failed one included); a death after the run's end is in :attr:`after_end`."""
        with self.store.lock:
            return [
                r
                for r in self.store.recoveries
                if r.get("run") == self.run_id and "replica" in r and r.get("kind") != AFTER_THE_END
            ]

    @property
    def after_end(self) -> list[dict]:
        with self.store.lock:
            return [r for r in self.store.recoveries if r.get("run") == self.run_id and r.get("kind") == AFTER_THE_END]

    def quorum(self) -> tuple[int | None, int]:
        """(quorum size of the newest step, that step) as the ranks reported it."""
        last = self.store.last_steps(self.run_id)
        if not last:
            return None, 0
        rank = max(last, key=last.get)
        q = self.store.last(self.run_id, "quorum", rank)
        return (int(q) if q is not None else None), last[rank]

    def status_text(self) -> str:
        q, step = self.quorum()
        lh = self.rankset.lighthouse
        state = self.state
        if self.left_out:  # the replicas left finished (or go on) without it
            out = ", ".join(str(r) for r in sorted(self.left_out))
            state += f" alone, without replica {out} (its replacement failed)"
        head = (
            f"fault-tolerant run {self.run_id}: {state}; {self.replicas} replica groups x {self.group_size} ranks"
            + (" (each sharded over its ranks, hsdp)" if self.strategy == "hsdp" else "")
            + ", "
            f"quorum {q if q is not None else '-'} of {self.replicas} at step {step}, target step {self.target}; "
            f"quorum timeout {self.quorum_timeout:g} s"
            + (f"; lighthouse {lh.address} (pid {lh.pid})" if lh is not None and lh.alive() else "")
        )
        lines = [head, *("  " + describe(r) for r in self.records + self.after_end)]
        states = self.store.run_state(self.run_id, self.sess.runs.marks.get(self.run_id, 0))
        for rank, e in sorted(states.items()):
            if e["state"] in ("error", "stopped") and e.get("reason"):
                lines.append(f"  rank {rank} {e['state']}: {e['reason'].splitlines()[0][:300]}")
        if self.error:
            lines.append("  " + self.error)
        return "\n".join(lines)

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)

    def stop(self) -> str:
        """End the run on every rank after one step, the same for all (``engine.fault_tolerant.stop_at``)."""
        self.stopping = True
        live = [r for r in range(self.rankset.world_size) if r not in {d["rank"] for d in self.rankset.dead()}]

        def newest() -> tuple[int, float]:
            t0 = time.monotonic()
            step = max(s.step for s in self.rankset.apply(rpc.handle, rpc.FaultTolerantStatus(), ranks=live))
            return step, time.monotonic() - t0

        # past every rank's step by the time the call reaches it: a rank already beyond the step would
        # go on alone and leave its replica's others waiting in a collective. A step can be far
        # shorter than a call to the ranks on a loaded host: the margin is the steps taken in a few
        # such calls' time, timed here
        first, latency = newest()
        time.sleep(0.2)
        step, again = newest()
        rate = max(0, step - first) / (0.2 + again)
        at = step + 2 + int(rate * (0.5 + 4 * max(latency, again)))
        self.rankset.apply(rpc.handle, rpc.StopFaultTolerantAt(step=at), ranks=live)
        return f"stop requested: the fault-tolerant run {self.run_id} stops after step {at} on every rank"

    def rank_status(self) -> list[dict]:
        """Each live rank's replica member; the trainer's table where the session has since moved on."""
        rs = self.rankset
        if rs is not self.sess.rankset or not rs.running:
            return super().rank_status()
        dead = {d["rank"] for d in rs.dead()}  # a replica left out, a rank lost after the end
        live = [r for r in range(rs.world_size) if r not in dead]
        return [m.to_dict() for m in rs.apply(rpc.handle, rpc.FaultTolerantStatus(), ranks=live)]

    def close(self) -> None:
        self._stop.set()
        if not self.done.is_set():
            self._set("closed")
            self.done.set()

    # ------------------------------------------------------------------ watching
    def _loop(self) -> None:
        from ..background import lower_this_thread

        lower_this_thread()
        try:
            while not self._stop.wait(self.poll):
                rs = self.sess.rankset
                if rs is not self.rankset or not rs.running:
                    return self._finish("stopped")
                deaths = rs.watcher.known() if rs.watcher is not None else {}
                deaths = {r: d for r, d in deaths.items() if d["pid"] not in self._settled}
                lost = sorted({r // self.group_size for r in deaths} - set(self.left_out))
                if lost and not self.stopping:
                    ended = self._taken_all_steps(deaths)
                    for replica in lost if ended is not None else ():
                        (self._note_after_the_end if ended else self._replace)(replica, deaths)
                self._note_healed()
                states = self.store.run_state(self.run_id, self.sess.runs.marks.get(self.run_id, 0))
                out = {r for r in range(rs.world_size) if r // self.group_size in self.left_out} | self._ended_dead
                states = {r: e for r, e in states.items() if r not in out}
                if len(states) == rs.world_size - len(out) and {e["state"] for e in states.values()} <= {
                    "finished",
                    "stopped",
                }:
                    return self._finish(
                        "finished" if all(e["state"] == "finished" for e in states.values()) else "stopped"
                    )
        except Exception as exc:  # never die silently: a lost replica would wait for a person unannounced
            self.error = f"the replacement of lost replicas stopped: {type(exc).__name__}: {exc}"
            print(self.error, flush=True)
            self._finish("error")

    def _finish(self, state: str) -> None:
        if state in ("finished", "stopped") and self.rankset.running:  # finished is final: the ranks are done
            from .trainer import settle

            live = set(range(self.rankset.world_size)) - {d["rank"] for d in self.rankset.dead()}
            if live:
                settle(self.rankset, self.run_id, SETTLE_S, ranks=sorted(live))
        self._set(state)
        self.done.set()

    def _set(self, state: str) -> None:
        self._state = state
        self._changed()

    def _taken_all_steps(self, deaths: dict) -> bool | None:
        """Whether the run had taken all its steps when these ranks died: every live rank committed the
        last step (a replica commits it only with every replica in the quorum, or alone once the
        notebook gave up on one), so a replacement would find no run to join. None while that is not
        known yet: a live rank is inside the last step and may still commit it (a few seconds at most)."""
        g = self.group_size
        lost = {r // g for r in deaths} | set(self.left_out)  # the lost replicas' other ranks may be ending too
        live = [r for r in range(self.rankset.world_size) if r // g not in lost]
        if not live:
            return False
        try:
            rows = [
                m.to_dict() for m in self.rankset.apply(rpc.handle, rpc.FaultTolerantStatus(), ranks=live, timeout=10)
            ]
        except Exception:  # another rank is dying: replace, not wait for it
            return False
        if all(s["step"] >= self.target for s in rows):
            self._undecided_since = None
            return True
        inside = [s for s in rows if s["step"] == self.target - 1 and not s["waiting"]] + [
            s for s in rows if s["step"] >= self.target and s["state"] == "running"
        ]
        now = time.monotonic()
        if inside and not any(s["step"] < self.target - 1 or s["waiting"] for s in rows):
            if self._undecided_since is None:
                self._undecided_since = now
            if now - self._undecided_since < 2 * self.quorum_timeout + 10.0:
                return None
        self._undecided_since = None
        return False

    def _note_after_the_end(self, replica: int, deaths: dict) -> None:
        """A rank of ``replica`` died once the run had taken all its steps: a record and a log line, and
        the dead ranks' state in the stream (a rank killed before it said it finished still shows the
        steps it took), not a replacement."""
        from ...shared import events

        g = self.group_size
        ranks = [r for r in range(replica * g, (replica + 1) * g) if r in deaths]
        dead = min((deaths[r] for r in ranks), key=lambda d: (d.get("exit_code") == EXIT_REPLICA_LOST, d["time"]))
        rec = self._lost_record(AFTER_THE_END, len(self.after_end) + 1, replica, ranks, dead, self.target)
        self._settled.update(deaths[r]["pid"] for r in ranks)
        self._ended_dead.update(ranks)
        self.store.note_recovery(rec)
        self._mark_dead(ranks, "finished", f"died after the run's last step: {dead['exit']}")
        text = "fault tolerance: " + describe(rec)
        self.store.add([events.log_event(run=self.run_id, rank=-1, text=text)])
        print(text, flush=True)

    def _lost_record(self, kind: str, n: int, replica: int, ranks: list[int], dead: dict, step: int) -> dict:
        """The record of ``replica`` losing ``ranks`` (``dead``: the death that counts) at ``step``."""
        return {
            "run": self.run_id,
            "run_kind": self.kind,
            "n": n,
            "kind": kind,
            "replica": replica,
            "ranks": ranks,
            "rank": dead["rank"],
            "host": dead["host"],
            "detail": dead["exit"],
            "time": dead["time"],
            "failed_step": step,
            "world_size": self.group_size,
            "checkpoint": None,
            "checkpoint_step": None,
        }

    def _mark_dead(self, ranks: list[int], state: str, reason: str) -> None:
        """Put the end of dead ``ranks`` in the stream, where they said nothing more (``train wait``, the
        dashboard); ``state``: finished where they had taken every step, else error."""
        from ...shared import events

        states = self.store.run_state(self.run_id, self.sess.runs.marks.get(self.run_id, 0))
        steps = self.store.last_steps(self.run_id)
        batch = [
            events.status_event(
                run=self.run_id,
                rank=r,
                state=state if state != "finished" or steps.get(r) == self.target else "error",
                step=steps.get(r, 0),
                reason=reason,
            )
            for r in ranks
            if states.get(r, {}).get("state") not in ("finished", "stopped", "error")
        ]
        if batch:
            self.store.add(batch)

    def _replace(self, replica: int, deaths: dict) -> None:
        from ...shared import events

        g = self.group_size
        ranks = list(range(replica * g, (replica + 1) * g))
        # the rank that was lost, not one that ended itself after it (it exits with EXIT_REPLICA_LOST)
        dead = min(
            (deaths[r] for r in ranks if r in deaths),
            key=lambda d: (d.get("exit_code") == EXIT_REPLICA_LOST, d["time"], d["rank"]),
        )
        steps = self.store.last_steps(self.run_id)
        self.generation[replica] += 1
        send_as = f"{self.run_id}-r{replica}g{self.generation[replica]}"
        rec = self._lost_record(
            "died", len(self.records) + 1, replica, ranks, dead, max(steps.values()) if steps else 0
        )
        rec["sent_as"] = send_as
        rs = self.rankset
        t0 = time.time()
        others = [r for r in range(rs.world_size) if r not in ranks and r not in deaths]
        # the others step on meanwhile; their last step waits for the replacement (the ranks see
        # the short quorum themselves: ``engine.fault_tolerant``), unless it fails (below)
        try:
            replacements.replace_ranks(rs, ranks)
            try:  # the Lab's sidebar shows the new pids, and no death for these ranks
                from .. import registry

                registry.ranks_replaced(rs, ranks)
            except Exception:
                pass
            collector = self.sess.stream.collector
            rs.apply(rpc.handle, rpc.ConnectStream(collector.address, collector.key), ranks=ranks, timeout=60)
            # the new ranks' sequence numbers start again: they send under their own id, filed under the run
            self.store.continue_run(send_as, self.run_id)
            plan = {
                **self.plan,
                "send_as": send_as,
                "store_ports": {**self.plan["store_ports"], replica: network.free_port()},
            }
            rs.apply(rpc.handle, rpc.StartFaultTolerant(plan=plan, begin=False), ranks=ranks, timeout=300)
            rs.apply(rpc.handle, rpc.BeginFaultTolerant(), ranks=ranks, timeout=60)
        except Exception as exc:  # the others finish alone; this replica is out of the run
            rec["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            self.left_out[replica] = rec["error"]
            self._settled.update(d["pid"] for r, d in deaths.items() if r in ranks)
            self._finish_alone(others)
            self._mark_dead(ranks, "error", f"replica {replica} is out of the run: its replacement failed")
        finally:
            rec["restart_s"] = round(time.time() - t0, 3)
            self.store.note_recovery(rec)
            text = "fault tolerance: " + describe(rec)
            self.store.add([events.log_event(run=self.run_id, rank=-1, text=text)])
            print(text, flush=True)

    def _finish_alone(self, ranks: list[int]) -> None:
        """The replacement failed: the other replicas' ranks take their last step without it rather
        than wait for it for good; a rank that died meanwhile is left to the next look."""
        dead = {d["rank"] for d in self.rankset.dead()}
        live = [r for r in ranks if r not in dead]
        if not live:
            return
        try:
            self.rankset.apply(rpc.handle, rpc.FinishWithoutLostReplica(), ranks=live, timeout=30)
        except Exception:
            pass

    def _note_healed(self) -> None:
        """A replacement healed once its first step arrived: that step, and the time since the failure."""
        pending = [r for r in self.records if r.get("checkpoint_step") is None and not r.get("error")]
        if not pending:
            return
        with self.store.lock:
            rows = [row for row in self.store.rows if row["run"] == self.run_id]
        for rec in pending:
            first = [
                row
                for row in rows
                if row["rank"] in rec["ranks"] and row["time"] > rec["time"] + rec["restart_s"] - 1e-3
            ]
            if first and min(row["step"] for row in first) > 0:
                row = min(first, key=lambda x: x["step"])
                with self.store.lock:  # ``rec`` is the store's own record (``records``)
                    rec.update(checkpoint_step=int(row["step"]), rejoined_s=round(row["time"] - rec["time"], 3))
                    self.store.version += 1


def start(
    sess,
    steps: int,
    *,
    replicas: int | None = None,
    quorum_timeout: float | None = None,
    strategy: str | None = None,
    model: str | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
) -> FaultTolerantRun:
    """Train ``steps`` steps on ``sess``'s ranks with each replica group a torchft replica group
    (module doc); every refusal (one line, ``ValueError``) comes before anything starts."""
    rs = sess.rankset
    replicas = 2 if replicas is None else replicas
    quorum_timeout = 10.0 if quorum_timeout is None else quorum_timeout
    strategy = strategy or "ddp"
    check(rs, strategy=strategy, replicas=replicas, quorum_timeout=quorum_timeout, steps=steps)
    before = sess.runs.current
    if isinstance(before, FaultTolerantRun) and not before.done.is_set():
        raise ValueError(
            f"the fault-tolerant run {before.run_id} is still training: `%distrain train stop` first; "
            "nothing was started"
        )
    if rs.dead():
        raise ValueError("ranks of this set are dead: `%distrain restart` first; nothing was started")
    busy = {s.state for s in rs.apply(rpc.handle, rpc.TrainerStatus())} & {"running", "paused"}
    if busy:
        raise ValueError(
            f"the workbench trainer on these ranks is {'/'.join(sorted(busy))}: `%distrain train stop` first "
            "(a fault-tolerant run trains in a loop of its own); nothing was started"
        )
    return FaultTolerantRun(
        sess,
        steps,
        replicas=replicas,
        quorum_timeout=quorum_timeout,
        strategy=strategy,
        model=model or "tiny",
        batch_size=batch_size or 8,
        lr=lr or 1e-3,
    )
