"""Notebook-side training API: ``workbench.train.start(50)``, ``.pause()``, ``.set(lr=3e-4)``...

The magics (``%distrain train ...``) call these. Each is a few ``apply`` calls on the
ranks' ``workbench.engine.control`` functions, which only flip flags in the trainer
thread, so they return at once even mid-run. A hyperparameter change is two-phase:
staged (and checked) on every rank, then committed; the ranks' per-step MAX agreement
then applies it at the same step everywhere, and a bad name changes nothing.
"""

from __future__ import annotations

from ..shared.errors import BudgetSpent
from . import api, session, setup_recipe, stream
from .setup_recipe import NO_SETUP, repeatable_setup

DONE_STATES = ("finished", "stopped", "error")

# `workbench.train.setup(...)` / `.last_setup`: the recipe a resume or a recovery repeats
setup = setup_recipe.setup
last_setup = setup_recipe.last_setup


def _rs(rankset=None):
    return rankset if rankset is not None else api.current()


def start(
    steps: int,
    *,
    step_timeout: float | None = None,
    max_failures: int | None = None,
    setup=None,
    rankset=None,
) -> str:
    """Run ``steps`` more steps on every rank's trainer in the background; returns the run id.

    ``step_timeout``: when no step arrives for that many seconds while the run is
    running, print which ranks are stuck and where (:mod:`workbench.notebook.watchdog`).
    ``max_failures``: a failure budget: up to that many times, a dead rank, a hang past
    ``step_timeout`` or a NaN/spike pause restarts the set, repeats the setup, loads the
    newest verified checkpoint and trains on to the same target step
    (:mod:`workbench.notebook.recovery`); needs a recorded setup, or ``setup``: the code
    (a str run on every rank) or function that builds the trainer, as ``resume`` takes it.
    """
    from ..engine import control

    if step_timeout is not None and step_timeout <= 0:
        raise ValueError(f"step_timeout must be positive seconds, got {step_timeout}")
    if max_failures is not None and (
        isinstance(max_failures, bool) or int(max_failures) != max_failures or max_failures < 1
    ):
        raise ValueError(
            f"max_failures is how many recoveries to allow: a whole number of at least 1, got {max_failures!r}"
        )
    if setup is not None and max_failures is None:
        raise ValueError("setup= is the code a recovery repeats: it goes with max_failures=K")
    rs = _rs(rankset)
    sess = session.of(rs)
    if max_failures is not None and setup is None and repeatable_setup(sess) is None:
        raise ValueError(NO_SETUP)
    store = stream.attach(rs).store
    mark = len(store.statuses)
    states = rs.apply(control.start, int(steps))
    run = states[0]["run"]
    sess.marks[run] = mark
    sess.started_run = run
    old, sess.watchdog = sess.watchdog, None
    if old is not None:
        old.close()
    if sess.supervisor is not None:
        sess.supervisor.close()
        sess.supervisor = None
    if sess.fault_tolerant is not None:  # a later run of the workbench trainer is what status shows
        sess.fault_tolerant.close()
        sess.fault_tolerant = None
    if setup is not None:
        sess.resume_setup = setup  # remembered as `restart --load --setup` remembers it
    if max_failures is not None:  # the supervisor owns the step watchdog: a hang is one of its failures
        from . import recovery

        sess.supervisor = recovery.Supervisor(
            sess,
            run,
            int(states[0]["target"]),
            int(max_failures),
            step_timeout=step_timeout,
            on_hang=_on_hang,
            stop_run=lambda rs: stop(rankset=rs),
        )
    elif step_timeout:
        from .watchdog import StepWatchdog

        sess.watchdog = StepWatchdog(
            rs, store, run, step_timeout, mark=mark, on_hang=lambda rep: _on_hang(sess, store, rep)
        )
    return run


def fault_tolerant(steps: int, **options):
    """``steps`` steps with each replica group a torchft replica group: survivors keep training while a
    lost replica is replaced and heals from a live peer (``train start --fault-tolerant``; ``options``:
    ``replicas=2``, ``quorum_timeout=10.0``, ``strategy="ddp"`` or ``"hsdp"`` (each replica sharded over its
    ranks), ``model``, ``batch_size``, ``lr``). Returns the run:
    ``.run``, ``.status_text()``, ``.records``; ``workbench.train.wait()`` waits for it."""
    from . import fault_tolerance

    return fault_tolerance.start(steps, **options)


def _on_hang(sess, store, rep: dict) -> None:
    from ..shared import events

    sess.hangs.append(rep)
    store.add([events.log_event(run=rep["run"], rank=-1, text=rep["text"])])
    print(rep["text"], flush=True)


def pause(reason: str = "", *, rankset=None) -> list[dict]:
    from ..engine import control

    return _rs(rankset).apply(control.request, "pause", reason)


def resume(*, rankset=None) -> list[dict]:
    from ..engine import control

    return _rs(rankset).apply(control.request, "resume")


def stop(*, rankset=None) -> list[dict]:
    from ..engine import control

    return _rs(rankset).apply(control.request, "stop")


def set(rankset=None, **hparams) -> dict:  # noqa: A001 - `train.set(lr=...)` reads best
    """Change optimizer/trainer hyperparameters on every rank, at the same step: the next one,
    or the one after when the running step's agreement had already started."""
    from ..engine import control, staging

    if not hparams:
        raise ValueError("nothing to set: e.g. train.set(lr=3e-4)")
    staged = staging.change_on_ranks(_rs(rankset), control.stage, hparams)  # a refusal on any rank commits nothing
    return staged[0]


def inject(kind: str = "nan", step: int | None = None, *, ranks=None, rankset=None) -> list[dict]:
    """Fault drill: a NaN/Inf loss at ``step`` on ``ranks`` (default all)."""
    from ..engine import control

    return _rs(rankset).apply(control.inject, kind, step, ranks=ranks)


def status(*, rankset=None) -> list[dict]:
    """The trainer state of every rank, asked of the ranks themselves."""
    from ..engine import control

    return _rs(rankset).apply(control.status)


def states(run: str | None = None, *, rankset=None) -> dict[int, str]:
    """rank -> last state the stream reported for ``run`` (default: the latest run)."""
    rs = _rs(rankset)
    store = stream.attach(rs).store
    sess = session.of(rs)
    run = run or sess.started_run or store.latest_run()
    if not run:
        return {}
    return {r: e["state"] for r, e in sorted(store.run_state(run, sess.marks.get(run, 0)).items())}


def wait(
    until=DONE_STATES, timeout: float = 120.0, *, run: str | None = None, step: int | None = None, rankset=None
) -> dict[int, str]:
    """Wait until every rank's stream reports a state in ``until`` (or reached ``step``).

    Works from the stream, not by asking the ranks, so it sees exactly what the
    dashboard and ``metrics()`` see: when it returns, every step before the state
    change has arrived. Raises TimeoutError naming each rank's last state.
    """
    rs = _rs(rankset)
    store = stream.attach(rs).store
    until = (until,) if isinstance(until, str) else tuple(until)

    sess = session.of(rs)
    run = run or sess.started_run
    sup = sess.supervisor if sess.supervisor is not None and sess.supervisor.run == run else None

    def done(s) -> bool:
        if sup is not None and sup.state == "gave up":
            return True
        # a recovery may restart at another size (a lost host): count the set that runs now
        n = sess.rankset.world_size if sup is not None and sess.rankset is not None else rs.world_size
        r = run or s.latest_run()
        if r is None:
            return False
        if step is not None:
            last = s.last_steps(r)
            return len(last) == n and min(last.values()) >= step
        st = s.run_state(r, sess.marks.get(r, 0))
        return len(st) == n and all(e["state"] in until for e in st.values())

    ok = store.wait(done, timeout)
    if ok and sup is not None and step is None:
        sup.wait(5.0)  # it sees the same end at its next look: its state and records are final
    ft = sess.fault_tolerant
    if ok and ft is not None and ft.run == run and step is None:
        ft.wait(5.0)  # likewise a fault-tolerant run's watcher
    if sup is not None and sup.state == "gave up":
        raise BudgetSpent(sup.summary)
    rs = sess.rankset if sup is not None and sess.rankset is not None else rs  # a recovery's new set
    if not ok:
        raise TimeoutError(
            f"training did not reach {step if step is not None else '/'.join(until)} within "
            f"{timeout} s; last states: {states(run, rankset=rs)}"
        )
    return states(run, rankset=rs)
