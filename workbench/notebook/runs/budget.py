"""A failure budget (``train start --max-failures K``): a run that recovers without a person.

A thread watches what already reports a failure (a rank's death, a hang past ``--step-timeout``,
a trainer that raised, a NaN/spike pause) and, within the budget, does what a person would:
restart (on the hosts left when one is lost: :func:`shrink`), repeat the setup, load the newest
verified checkpoint every rank's delivered steps reach (:meth:`FailureBudget._bound`) and train on
to the target; the store files the new trainer's steps under the run it continues. How it
decides, step by step: docs/unattended.md."""

from __future__ import annotations

import os
import threading
import time

from ...engine import rpc
from .contract import Run, register
from .part import begin, note_hang, recovering

LOSS_WORDS = ("non-finite", "spike")  # the guard's pause reasons (engine.trainer.REASONS)
RECOVERY_WAIT_S = 600.0  # a recovery under way finishes before the run is handed to another process
SETTLE_S = 30.0  # how long its end waits for the ranks' trainer threads (their last events, the auto-save)


def describe(rec: dict) -> str:
    """One line of a recovery record."""
    where = f"rank {rec['rank']} (host {rec['host']})" if rec.get("rank") is not None else "the run"
    kind = rec["kind"]
    if kind == "host lost":  # every rank there: the host is what failed
        where, kind = f"host {rec['host']}", "lost"
    what = rec["detail"].splitlines()[0][:200] if rec.get("detail") else ""
    head = f"failure {rec['n']}: {where} {kind} at step {rec['failed_step']}" + (f": {what}" if what else "")
    if rec.get("error"):
        return f"{head}; the recovery failed: {rec['error']}"
    if rec.get("checkpoint_step") is None:
        return head
    ck = rec["checkpoint"] or "no checkpoint yet: from the setup's step 0"
    lost = f"{rec['lost_s']:.1f} s lost" if rec.get("lost_s") is not None else f"down {rec['down_s']:.1f} s"
    ranks = f"{rec['world_size']} ranks"
    if rec.get("from_world_size") is not None:  # a lost host: on the hosts left, resharded on load
        ranks += f" (was {rec['from_world_size']}) on {rec['hosts']}"
    text = f"{head}; restarted {ranks}, loaded {ck} (step {rec['checkpoint_step']}), {rec['steps_redone']} steps redone, {lost}"
    over = rec.get("passed_over")
    if over:
        text += (
            f"; not {over['checkpoint']} (step {over['step']}): rank {over['rank']}'s steps after "
            f"{over['last_step']} never reached the notebook (redone instead)"
        )
    for gone in rec.get("lost") or ():
        text += (
            f"; steps {gone['first']}-{gone['last']} of rank {gone['rank']} were lost "
            "(they never reached the notebook and no checkpoint is that old)"
        )
    return text


def shrink(sess, rs) -> dict:
    """A host is lost: restart options (``n``, ``hosts``) for the largest size the layout allows on
    the hosts left; ``{}`` where the launcher has no hosts to drop (the same request again).

    The layout is the recorded recipe's strategy (its degrees must divide the size, its global
    batch split over the data-parallel ranks), checked by a surviving rank (``control.largest_size``:
    the strategies need torch); with setup code of the user's own, or no survivor that answers,
    every rank the hosts left hold (the setup's own check then names the degrees that fit).
    Checkpoints reshard on load.
    """
    from ...shared.errors import RankFailure
    from ..cluster import ssh

    lost = rs.lost_entries()
    if not lost:
        return {}
    hosts, room = ssh.remaining_hosts(rs.config.hosts, lost)
    if room == 0:
        raise ValueError(f"every host of --hosts {rs.config.hosts} is lost")
    n = room
    recipe = sess.setup.recipe if sess.setup.given is None else None
    dead = rs.watcher.known() if rs.watcher is not None else {}
    survivors = [r for r in range(rs.world_size) if r not in dead]
    if recipe is not None and survivors:
        try:
            (size,) = rs.apply(
                rpc.handle,
                rpc.LargestSize(strategy=recipe["strategy"], room=room, batch_size=recipe.get("batch_size")),
                ranks=survivors[:1],
                timeout=30,
            )
            n = size.n
        except RankFailure as exc:  # no size fits: say so rather than rebuild something else
            raise ValueError(str(exc).split(": ", 2)[-1]) from None
        except Exception:  # the survivor is stuck too: the setup's own check will speak
            n = room
    hosts, n = ssh.remaining_hosts(rs.config.hosts, lost, n)
    return {"n": n, "hosts": hosts}


@register
class FailureBudget(Run):
    """Watches run ``run_id`` of ``sess`` and recovers it up to ``max_failures`` times (module doc)."""

    kind = "failure budget"

    def __init__(
        self,
        sess,
        run_id: str,
        target: int,
        max_failures: int,
        *,
        step_timeout: float | None = None,
        poll: float = 0.25,
        failures: int = 0,
    ):
        """``failures``: recoveries already used (a run carried from another process)."""
        if max_failures < 0:
            raise ValueError(f"max_failures must be 0 or more, got {max_failures}")
        self.sess, self.run_id, self.target = sess, run_id, int(target)
        self.max_failures, self.step_timeout, self.poll = int(max_failures), step_timeout, poll
        self.failures = int(failures)
        self._on_ranks = run_id  # the run id of the ranks' trainer (a recovered trainer names a new one)
        self._state = "watching"  # -> recovering -> watching ... -> finished | stopped | gave up | closed
        self.summary = ""
        self._hang: dict | None = None
        self._stop = threading.Event()
        self.done = threading.Event()
        self.watchdog = None
        self.rankset = sess.rankset  # the set it watches: another one (a restart by hand) ends the watch
        self._watch(sess.rankset)
        self._thread = threading.Thread(target=self._loop, name="workbench-recovery", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ reading
    @property
    def state(self) -> str:
        return self._state

    def _set(self, state: str) -> None:
        self._state = state
        self._changed()

    @property
    def store(self):
        return self.sess.store

    @property
    def records(self) -> list[dict]:
        return [r for r in self.store.recoveries if r.get("run") == self.run_id]

    @classmethod
    def describe(cls, record: dict) -> str:
        return describe(record)

    def status_text(self) -> str:
        """The budget and every recovery so far."""
        head = (
            f"training {self.run_id}: {self.state}; failure budget {self.failures}/{self.max_failures} used, "
            f"target step {self.target}"
        )
        lines = [head, *("  " + describe(r) for r in self.records)]
        if self.summary and self.state == "gave up":
            lines.append(self.summary.splitlines()[0])
        return "\n".join(lines)

    def rank_status(self) -> list[dict]:
        rs = self.sess.rankset
        if rs is None or not rs.running or (self.state == "gave up" and rs.dead()):
            return []  # a dead rank answers nothing: the status text says what happened
        return super().rank_status()

    def wait(self, timeout: float | None = None) -> bool:
        """True once the budget is done (finished, stopped, gave up, closed)."""
        return self.done.wait(timeout)

    def stop(self) -> str:
        """The trainer stops at one step on every rank; the budget then ends as stopped."""
        self.sess.rankset.apply(rpc.handle, rpc.ControlTraining(action="stop"))
        return "stop requested: takes effect on every rank at the same step"

    def close(self) -> None:
        """Stop watching (a new ``train start``, the set stopped by hand); changes nothing on the ranks."""
        self._stop.set()
        if self.watchdog is not None:
            self.watchdog.close()
        if not self.done.is_set():
            self._set("closed")
            self.done.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (after :meth:`close`, a recovery under way finishes first)."""
        self._thread.join(timeout)

    # ------------------------------------------------------------------ carrying
    def to_state(self) -> dict | None:
        """A recovery under way finishes first: the set it starts is the one handed over."""
        active = not self.done.is_set()
        self.close()
        self.join(RECOVERY_WAIT_S)
        if not active:
            return None
        return {
            "run_id": self.run_id,
            "target": self.target,
            "max_failures": self.max_failures,
            "failures": self.failures,
            "step_timeout": self.step_timeout,
        }

    @classmethod
    def from_state(cls, sess, state: dict) -> FailureBudget:
        return cls(
            sess,
            state["run_id"],
            state["target"],
            state["max_failures"],
            step_timeout=state["step_timeout"],
            failures=state["failures"],
        )

    # ------------------------------------------------------------------ watching
    def _watch(self, rankset) -> None:
        if self.watchdog is not None:
            self.watchdog.close()
            self.watchdog = None
        if self.step_timeout:
            from .watchdog import StepWatchdog

            def on_hang(rep):
                note_hang(self.sess, rep)
                self._hang = rep

            mark = self.sess.runs.marks.get(self.run_id, 0)
            self.watchdog = StepWatchdog(
                rankset, self.store, self.run_id, self.step_timeout, mark=mark, on_hang=on_hang
            )

    def _loop(self) -> None:
        from ..background import lower_this_thread

        lower_this_thread()  # gives way to ranks training on the same cores
        try:
            while not self._stop.wait(self.poll):
                rs = self.sess.rankset
                if rs is not self.rankset or not rs.running:
                    self._finish("stopped", "the rank set was stopped or restarted by hand")
                    return
                failure = self._failure(rs)
                if failure is None:
                    ended = self._ended(rs)
                    if ended:
                        self._finish(*ended)
                        return
                    self._note_caught_up()
                    continue
                if self.failures >= self.max_failures:
                    self._give_up(failure)
                    return
                self.failures += 1
                if not self._recover(failure):
                    return
        except Exception as exc:  # never die silently: the run would wait for a person unannounced
            self._give_up({"kind": "budget error", "rank": None, "detail": f"{type(exc).__name__}: {exc}"})

    def _failure(self, rs, retold: bool = False) -> dict | None:
        """The first failure seen now, or None."""
        deaths = rs.watcher.known() if rs.watcher is not None else {}
        if deaths:
            d = deaths[min(deaths)]
            kind = "host lost" if d.get("host_lost") else "died"
            return {"kind": kind, "rank": d["rank"], "host": d["host"], "detail": d["exit"], "time": d["time"]}
        if self._hang is not None:
            rep, self._hang = self._hang, None
            stuck = rep.get("stuck") or []
            rank = stuck[0] if stuck else None
            return {
                "kind": "hung",
                "rank": rank,
                "host": self._host(rs, rank),
                "detail": rep["text"],
                "time": rep.get("time", time.time()),
            }
        for rank, e in sorted(self.store.run_state(self.run_id, self.sess.runs.marks.get(self.run_id, 0)).items()):
            reason = e.get("reason") or ""
            if e["state"] == "error":
                kind = "raised"
            elif e["state"] == "paused" and any(w in reason for w in LOSS_WORDS):
                kind = "paused on its loss"
            else:
                continue
            if not retold:  # a peer's death shows on the others as a raised collective: look once more
                time.sleep(1.0)
                return self._failure(rs, retold=True)
            return {"kind": kind, "rank": rank, "host": self._host(rs, rank), "detail": reason, "time": e["time"]}
        return None

    @staticmethod
    def _host(rs, rank) -> str | None:
        try:
            return rs.procs[rank].host if rank is not None else None
        except (AttributeError, IndexError, TypeError):
            return None

    def _ended(self, rs) -> tuple[str, str] | None:
        states = self.store.run_state(self.run_id, self.sess.runs.marks.get(self.run_id, 0))
        if len(states) < rs.world_size:
            return None
        kinds = {e["state"] for e in states.values()}
        if kinds == {"finished"}:
            return "finished", f"reached step {self.target}"
        if kinds <= {"finished", "stopped"} and "stopped" in kinds:
            return "stopped", "stopped from the notebook"
        return None

    def _note_caught_up(self) -> None:
        """Seconds lost: from the failure until the run is back at the step it had reached."""
        pending = [r for r in self.records if r.get("lost_s") is None and r.get("checkpoint_step") is not None]
        if not pending:
            return
        rs = self.sess.rankset
        size = rs.world_size if rs is not None else 0
        # the ranks that run now: after a lost host, the higher ranks of the old set never step again
        steps = {r: s for r, s in self.store.last_steps(self.run_id).items() if r < size}
        rec = pending[-1]
        if steps and min(steps.values()) >= rec["failed_step"]:
            with self.store.lock:
                rec["lost_s"] = round(time.time() - rec["time"], 3)
                self.store.version += 1

    # ------------------------------------------------------------------ acting
    def _recover(self, failure: dict) -> bool:
        """Restart, set up, load, start the steps left; False (and the run given up) when
        the recovery itself failed: a second try would rebuild the same broken thing."""
        from ...shared.checkpoint import catalog
        from .resume import restart_from_checkpoint

        self._set("recovering")
        sess = self.sess
        rs = sess.rankset
        if sess.stream.collector is not None and sess.stream.listening_to is rs:
            # the survivors' steps already sent (their window's batch) count: the run's step at the failure
            sess.stream.collector.drain(quiet=0.2, limit=2.0)
        steps = self.store.last_steps(self.run_id)
        rec = {
            "run": self.run_id,
            "run_kind": self.kind,
            "n": self.failures,
            **{k: failure.get(k) for k in ("kind", "rank", "host", "detail")},
            "time": failure.get("time") or time.time(),
            "failed_step": max(steps.values()) if steps else 0,
            "world_size": rs.world_size,
        }
        size: dict = {}  # a lost host: the size and hosts to restart on (shrink)
        root = (sess.checkpoints.autosave or {}).get("root") or sess.checkpoint_dir
        which = "latest" if catalog.entries(root) else None
        new_run: list[str] = []
        bound: dict = {}

        def before_load(new_rs) -> None:
            status = new_rs.apply(rpc.handle, rpc.TrainerStatus())
            if status[0].state == "none":
                raise RuntimeError("the setup built no trainer on the ranks")
            new_run.append(status[0].run)
            self.store.continue_run(status[0].run, self.run_id)
            begin(sess, self.run_id, len(self.store.statuses))
            bound.update(self._bound(rs.world_size, root))  # the old ranks' stream has ended by now
            return bound.get("at_most")

        with recovering(sess):
            try:
                if self.watchdog is not None:
                    self.watchdog.close()
                size = shrink(sess, rs)  # {} unless a host is lost (whatever was seen first)
                info = restart_from_checkpoint(sess, None, which, root=root, before_load=before_load, **size)
                new_rs = sess.rankset
                left = self.target - int(info["step"])
                if left > 0:
                    new_rs.apply(rpc.handle, rpc.StartTraining(steps=left))
            except Exception as exc:
                rec["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                self._record(rec)
                self._give_up(failure, why=f"the recovery failed ({rec['error']})")
                return False
        rec.update(
            world_size=new_rs.world_size,
            **({"from_world_size": rs.world_size, "hosts": size["hosts"]} if size else {}),
            checkpoint=info.get("name"),
            checkpoint_step=int(info["step"]),
            steps_redone=max(0, rec["failed_step"] - int(info["step"])),
            down_s=round(time.time() - rec["time"], 3),
            lost_s=None,
            new_run=new_run[0] if new_run else None,
            passed_over=bound.get("passed_over"),
            lost=[
                {"rank": r, "first": last + 1, "last": int(info["step"])}
                for r, last in sorted(bound.get("delivered", {}).items())
                if last < int(info["step"])
            ],
        )
        self.rankset = new_rs
        self._on_ranks = new_run[0] if new_run else self._on_ranks
        self._record(rec)
        self._watch(new_rs)
        self._set("watching")
        return True

    def _bound(self, ranks: int, root: str) -> dict:
        """Which checkpoint a recovery may load, read once the old ranks are gone (their collector
        closed by the restart: the store holds all it will ever hold of them). A checkpoint of step
        S holds steps 1..S (a step's event is queued before its hooks, the auto-save among them), so
        it may be loaded once every rank's step S is in the store. ``at_most``: the newest step
        every rank reached, when a checkpoint past it is passed over for an older one (which, and
        the rank that held it back, in ``passed_over``); ``delivered``: each rank's last step."""
        from ...shared.checkpoint import catalog

        last = self.store.last_steps(self.run_id)
        delivered = {r: int(last.get(r, 0)) for r in range(ranks)}
        out: dict = {"delivered": delivered}
        if not delivered:
            return out
        floor = min(delivered.values())
        found = catalog.entries(root)
        newer = [(f, m) for f, m in found if m.step > floor]
        if newer and any(m.step <= floor for _, m in found):  # none that old: the newest, its gap said
            folder, m = newer[-1]
            held = min(delivered, key=lambda r: (delivered[r], r))
            out["at_most"] = floor
            out["passed_over"] = {
                "checkpoint": os.path.basename(folder),
                "step": m.step,
                "rank": held,
                "last_step": floor,
            }
        return out

    def _record(self, rec: dict) -> None:
        from ...shared import events

        self.store.note_recovery(rec)
        text = "recovery " + describe(rec)
        self.store.add([events.log_event(run=self.run_id, rank=-1, text=text)])
        print(text, flush=True)

    def _finish(self, state: str, why: str) -> None:
        self.summary = f"training {self.run_id}: {state} ({why}) after {self.failures} recoveries"
        if self.watchdog is not None:
            self.watchdog.close()
        if state in ("finished", "stopped") and self.rankset.running:  # finished is final: the ranks are done
            from .trainer import settle

            settle(self.rankset, self._on_ranks, SETTLE_S)
        self._set(state)
        self.done.set()

    def _give_up(self, failure: dict, why: str = "") -> None:
        from ...shared import events

        steps = self.store.last_steps(self.run_id)
        where = f"rank {failure['rank']} (host {failure.get('host')})" if failure.get("rank") is not None else "the run"
        kind = failure["kind"]
        if kind == "host lost":
            where, kind = f"host {failure.get('host')}", "lost"
        detail = (failure.get("detail") or "").strip()
        lines = [
            f"training {self.run_id}: "
            + (why or f"failure budget spent ({self.failures} of {self.max_failures} recoveries used)")
            + "; "
            f"{where} {kind} at step {max(steps.values()) if steps else 0}"
            + (f": {detail.splitlines()[0][:300]}" if detail else "")
            + ". The run is stopped there; `%distrain restart --load` continues from the newest verified checkpoint.",
            *("  " + describe(r) for r in self.records),
        ]
        self.summary = "\n".join(lines)
        if self.watchdog is not None:
            self.watchdog.close()
        rs = self.sess.rankset
        if rs is not None and rs.running and rs.watcher is not None and not rs.watcher.known():
            try:  # every rank alive (a loss pause, a hang): end the run so nothing waits on it
                rs.apply(rpc.handle, rpc.ControlTraining(action="stop"))
            except Exception:
                pass
        self.store.add([events.log_event(run=self.run_id, rank=-1, text=self.summary)])
        print(self.summary, flush=True)
        self._set("gave up")
        self.done.set()
