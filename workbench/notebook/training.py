"""The training API: ``workbench.train.start(50)``, ``.pause()``, ``.set(lr=3e-4)``, ``.wait()``...

``%distrain train`` only parses, calls these and prints, so a script gets the same runs and the
same one-line refusals. :func:`start` is the one entry whose options choose the kind of run
(:mod:`workbench.notebook.runs`); the controls only flip flags in the ranks' trainer threads, and
a hyperparameter change is staged on every rank, then committed to apply at the same step."""

from __future__ import annotations

from ..engine import rpc
from ..shared.errors import BudgetSpent, Refused
from . import api, runs, session, setup_recipe, stream
from .runs import ENDED as DONE_STATES
from .setup_recipe import NO_SETUP, repeatable_setup

# `workbench.train.setup(...)` / `.last_setup`: the recipe a resume or a recovery repeats
setup = setup_recipe.setup
last_setup = setup_recipe.last_setup

# the teaching trainer's defaults where `train start` builds it (--gpt/--strategy)
TEACHING = {"strategy": "ddp", "model": "tiny", "batch_size": 8, "lr": 1e-3, "grad_accum": 1}


def _rs(rankset=None):
    return rankset if rankset is not None else api.current()


def current(*, rankset=None) -> runs.Run | None:
    """The current session's run (``.state``, ``.records``, ``.status_text()``, ``.wait()``), or None;
    its ranks need not run any more (a failure budget that gave up still says why)."""
    sess = session.of(rankset) if rankset is not None else session.current()
    return runs.current(sess) if sess is not None else None


def start(
    steps: int,
    *,
    model: str | None = None,
    strategy: str | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    grad_accum: int | None = None,
    step_timeout: float | None = None,
    max_failures: int | None = None,
    setup=None,
    fault_tolerant: bool = False,
    replicas: int | None = None,
    quorum_timeout: float | None = None,
    rankset=None,
) -> str:
    """Run ``steps`` more steps on every rank in the background; returns the run id.

    ``model``/``strategy`` (``--gpt``/``--strategy``, with ``batch_size``, ``lr``, ``grad_accum``) build
    the teaching GPT first (``tiny`` or ``small`` on the bundled text, default ``tiny`` under ``ddp``); without them ``lr`` and
    ``grad_accum`` change the trainer already on the ranks. ``step_timeout``: after that many
    seconds without a step, say which ranks are stuck and where. ``max_failures``: a failure budget
    (up to that many times a dead rank, a hang past ``step_timeout`` or a NaN/spike pause restarts
    the set, repeats the setup, loads the newest verified checkpoint and trains on to the same
    step); it needs a recorded setup, or ``setup``: the code (a str run on every rank) or function
    that builds the trainer. ``fault_tolerant``: each of ``replicas`` replica groups (default 2) is a
    torchft replica group, so survivors keep training while a lost one is replaced
    (``quorum_timeout`` s, default 10). Raises :class:`Refused` where the run cannot start as
    asked; nothing was changed then.
    """
    check_start(
        steps,
        step_timeout=step_timeout,
        max_failures=max_failures,
        setup=setup,
        fault_tolerant=fault_tolerant,
        replicas=replicas,
        quorum_timeout=quorum_timeout,
        grad_accum=grad_accum,
    )
    rs = _rs(rankset)
    sess = session.of(rs)
    if fault_tolerant:
        return _start_fault_tolerant(sess, steps, replicas, quorum_timeout, strategy, model, batch_size, lr)
    build = model is not None or strategy is not None
    if max_failures is not None and setup is None and not build and repeatable_setup(sess) is None:
        raise Refused(NO_SETUP)
    changes = {k: v for k, v in (("lr", lr), ("grad_accum", grad_accum)) if v is not None}
    if not build and batch_size is not None:
        raise Refused(
            "--batch-size sizes the teaching GPT that --gpt/--strategy build; a trainer "
            "already on the ranks draws its batches from its own data: add --gpt tiny to "
            "rebuild, or change the batch in your setup code; nothing was done"
        )
    _refuse_busy(rs, changes, build)
    if build:
        chosen = {"strategy": strategy, "model": model, "batch_size": batch_size, "lr": lr, "grad_accum": grad_accum}
        recipe = {k: TEACHING[k] if v is None else v for k, v in chosen.items()}
        setup_recipe.setup(recipe.pop("strategy"), rankset=rs, **recipe)
    elif changes:
        set(rankset=rs, **changes)
    if setup is not None:
        setup_recipe.remember(sess, setup)  # as `restart --load --setup` remembers it
    store = stream.attach(rs).store
    mark = len(store.statuses)
    states = rs.apply(rpc.handle, rpc.StartTraining(steps=int(steps)))
    run_id, target = states[0].run, int(states[0].target)
    runs.begin(sess, run_id, mark)
    if max_failures is not None:  # the budget owns the step watchdog: a hang is one of its failures
        from .runs.budget import FailureBudget

        run = FailureBudget(sess, run_id, target, int(max_failures), step_timeout=step_timeout)
    else:
        from .runs.trainer import TrainerRun

        run = TrainerRun(sess, run_id, target=target, mark=mark, step_timeout=step_timeout)
    with_ = f" with {', '.join(f'{k}={v}' for k, v in changes.items())}" if changes else ""
    budget = f", recovering by itself up to {max_failures} times" if max_failures else ""
    run.started_as = f"training {run_id}: {steps} steps on {rs.world_size} ranks{with_}{budget} (in the background)"
    runs.adopt(sess, run)
    return run_id


def check_start(
    steps: int,
    *,
    step_timeout=None,
    max_failures=None,
    setup=None,
    fault_tolerant: bool = False,
    replicas=None,
    quorum_timeout=None,
    grad_accum=None,
) -> None:
    """Refuse options of :func:`start` that cannot go together or are out of range, before the
    ranks are asked anything (``start`` does this first; ``train start`` before it looks up
    ``--setup VAR``)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise Refused(f"--steps is how many more steps: a whole number of at least 1, got {steps!r}")
    if step_timeout is not None and not step_timeout > 0:
        raise Refused(f"--step-timeout must be a positive number of seconds, got {step_timeout!r}")
    if max_failures is not None and (
        isinstance(max_failures, bool) or int(max_failures) != max_failures or max_failures < 1
    ):
        raise Refused(
            f"--max-failures is how many recoveries to allow: a whole number of at least 1, got {max_failures!r}"
        )
    if fault_tolerant:
        given = [
            flag
            for flag, value in (
                ("--max-failures", max_failures),
                ("--setup", setup),
                ("--step-timeout", step_timeout),
                ("--grad-accum", grad_accum),
            )
            if value is not None
        ]
        if given:
            raise Refused(
                f"{', '.join(given)} cannot go with --fault-tolerant: a fault-tolerant run replaces a lost replica "
                "itself while the others keep stepping (--quorum-timeout bounds the wait); --max-failures restarts "
                "the whole set instead; give one or the other; nothing was started"
            )
        return
    for flag, value in (("--replicas", replicas), ("--quorum-timeout", quorum_timeout)):
        if value is not None:
            raise Refused(f"{flag} goes with --fault-tolerant; nothing was started")
    if setup is not None and max_failures is None:
        raise Refused("--setup names the code a recovery repeats: it goes with --max-failures K; nothing was started")


def _refuse_busy(rs, changes: dict, build: bool) -> None:
    """Asked of the ranks: a trainer still running or paused takes no new start (``train set``
    changes it live), and ``lr``/``grad_accum`` need a trainer to change."""
    rows = rs.apply(rpc.handle, rpc.TrainerStatus())
    states = {r.state for r in rows}
    busy = sorted(states & {"running", "paused"})
    given = ", ".join("--" + k.replace("_", "-") for k in changes)
    if changes and not build and "none" in states:
        raise Refused(
            f"{given} change the trainer on the ranks, and there is none yet: add --gpt tiny "
            "(builds the teaching GPT) or build a Trainer in a %%distrain cell; nothing was done"
        )
    if busy and changes and not build:
        raise Refused(
            f"training is already {'/'.join(busy)}, so {given} "
            "would not start a run: `%distrain train set lr=...` changes it live; nothing was done"
        )
    if busy:
        row = next(r for r in rows if r.state in busy)
        raise Refused(
            f"training {row.run} is already {'/'.join(busy)} at step {row.step}: `%distrain train stop` ends it, "
            "`%distrain train wait` waits for it (workbench.train.stop() / .wait()); nothing was started"
        )


def _start_fault_tolerant(sess, steps, replicas, quorum_timeout, strategy, model, batch_size, lr) -> str:
    from .runs import fault_tolerant

    sess.rankset.require_running()
    try:
        run = fault_tolerant.start(
            sess,
            steps,
            replicas=replicas,
            quorum_timeout=quorum_timeout,
            strategy=strategy,
            model=model,
            batch_size=batch_size,
            lr=lr,
        )
    except ValueError as exc:
        raise Refused(str(exc)) from None
    run.started_as = (
        f"training {run.run_id}: {steps} steps, {run.replicas} torchft replica groups x {run.group_size} ranks"
        + (" (each sharded over its ranks, hsdp)" if run.strategy == "hsdp" else "")
        + f", quorum timeout {run.quorum_timeout:g} s (in the background)"
    )
    runs.adopt(sess, run)
    return run.run_id


def fault_tolerant(steps: int, **options) -> runs.Run:
    """``start(steps, fault_tolerant=True, **options)``, returning the run itself (``.run``,
    ``.status_text()``, ``.records``); ``options``: ``replicas=2``, ``quorum_timeout=10.0``,
    ``strategy="ddp"`` or ``"hsdp"`` (each replica sharded over its ranks), ``model``,
    ``batch_size``, ``lr``, ``rankset``."""
    start(steps, fault_tolerant=True, **options)
    return current(rankset=options.get("rankset"))


def _control(action: str, rankset=None) -> None:
    """A trainer control the session's run does not take (its ranks run a loop of their own) is
    refused in one line naming what it takes."""
    run = runs.current(session.of(_rs(rankset)))
    if run is None or action in run.controls or run.wait(0):
        return
    takes = [f"`train {a}`" for a in (*run.controls, "stop", "status", "wait")]
    raise Refused(
        f"`train {action}` changes the workbench trainer; the {run.kind} run {run.run_id} takes "
        f"{', '.join(takes[:-1])} and {takes[-1]}"
    )


def pause(reason: str = "", *, rankset=None) -> str:
    """Pause every rank at the same step; returns what was asked, in one line."""
    _control("pause", rankset)
    _rs(rankset).apply(rpc.handle, rpc.ControlTraining(action="pause", reason=reason))
    return "pause requested: takes effect on every rank at the same step"


def resume(*, rankset=None) -> str:
    """Resume a paused run at the same step on every rank."""
    _control("resume", rankset)
    _rs(rankset).apply(rpc.handle, rpc.ControlTraining(action="resume"))
    return "resume requested: takes effect on every rank at the same step"


def stop(*, rankset=None) -> str:
    """End the session's run at one step on every rank (however its kind ends it)."""
    run = runs.current(session.of(_rs(rankset)))
    if run is not None and not run.wait(0):
        return run.stop()
    _rs(rankset).apply(rpc.handle, rpc.ControlTraining(action="stop"))
    return "stop requested: takes effect on every rank at the same step"


def set(rankset=None, **hparams) -> dict:  # noqa: A001 - `train.set(lr=...)` reads best
    """Change optimizer/trainer hyperparameters on every rank, at the same step: the next one,
    or the one after when the running step's agreement had already started."""
    if not hparams:
        raise ValueError("nothing to set: e.g. train.set(lr=3e-4)")
    _control("set", rankset)
    rs = _rs(rankset)
    version = max(r.version for r in rs.apply(rpc.handle, rpc.NextVersion()))
    staged = rs.apply(rpc.handle, rpc.StageHparams(version=version, values=hparams))  # a refusal commits nothing
    if any(s.values for s in staged):
        rs.apply(rpc.handle, rpc.CommitTrainer(version=version))
    return staged[0].values


def inject(kind: str = "nan", step: int | None = None, *, ranks=None, rankset=None) -> list[dict]:
    """Fault drill: a NaN/Inf loss at ``step`` on ``ranks`` (default all)."""
    _control("inject", rankset)
    return [r.to_dict() for r in _rs(rankset).apply(rpc.handle, rpc.InjectFault(kind=kind, step=step), ranks=ranks)]


def status(*, rankset=None) -> list[dict]:
    """The trainer state of every rank, asked of the ranks themselves."""
    return [r.to_dict() for r in _rs(rankset).apply(rpc.handle, rpc.TrainerStatus())]


def states(run: str | None = None, *, rankset=None) -> dict[int, str]:
    """rank -> last state the stream reported for ``run`` (default: the latest run)."""
    rs = _rs(rankset)
    store = stream.attach(rs).store
    sess = session.of(rs)
    run = run or sess.runs.started or store.latest_run()
    if not run:
        return {}
    return {r: e["state"] for r, e in sorted(store.run_state(run, sess.runs.marks.get(run, 0)).items())}


def wait(
    until=DONE_STATES, timeout: float = 120.0, *, run: str | None = None, step: int | None = None, rankset=None
) -> dict[int, str]:
    """Wait until every rank's stream reports a state in ``until`` (or reached ``step``).

    Waiting for the end (the default) waits for the session's run through its kind: it returns
    once nothing of the run still works on any rank, so the next ``start`` finds the ranks free.
    It works from the stream, so when it returns every step before the state change has arrived
    (what the dashboard and ``metrics()`` show). Raises TimeoutError naming each rank's last
    state, :class:`BudgetSpent` when a failure budget gave up.
    """
    rs = _rs(rankset)
    sess = session.of(rs)
    run = run or sess.runs.started
    until = (until,) if isinstance(until, str) else tuple(until)
    supervised = runs.current(sess)
    if supervised is not None and supervised.run_id != run:
        supervised = None
    if step is None and frozenset(until) == frozenset(DONE_STATES):
        ok = _wait_for_the_end(sess, rs, supervised, run, timeout)
    else:
        ok = _wait_on_stream(sess, rs, supervised, run, until, step, timeout)
    if supervised is not None and supervised.state == "gave up":
        raise BudgetSpent(supervised.summary)
    rs = sess.rankset if sess.rankset is not None else rs  # a recovery's new set
    if not ok:
        raise TimeoutError(
            f"training did not reach {step if step is not None else '/'.join(until)} within "
            f"{timeout} s; last states: {states(run, rankset=rs)}"
        )
    return states(run, rankset=rs)


def _wait_for_the_end(sess, rs, supervised, run, timeout) -> bool:
    if supervised is None:  # a run started without `train start` (a Trainer's own start): watched now
        import time

        from .runs.trainer import TrainerRun

        store = stream.attach(rs).store
        deadline = time.monotonic() + timeout
        if run is None and not store.wait(lambda s: s.latest_run() is not None, timeout):
            return False
        run = run or store.latest_run()
        supervised = TrainerRun(sess, run, target=0, mark=sess.runs.marks.get(run, 0))
        timeout = max(0.0, deadline - time.monotonic())
    return supervised.wait(timeout)


def _wait_on_stream(sess, rs, supervised, run, until, step, timeout) -> bool:
    store = stream.attach(rs).store

    def done(s) -> bool:
        if supervised is not None and supervised.state == "gave up":
            return True
        cur = sess.rankset if sess.rankset is not None else rs  # a recovery may restart at another size
        r = run or s.latest_run()
        if r is None:
            return False
        if step is not None:
            last = s.last_steps(r)
            return len(last) == cur.world_size and min(last.values()) >= step
        st = s.run_state(r, sess.runs.marks.get(r, 0))
        return len(st) == cur.world_size and all(e["state"] in until for e in st.values())

    return store.wait(done, timeout)
