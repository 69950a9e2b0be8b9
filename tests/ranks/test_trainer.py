"""Tier 2: the trainer on real gloo ranks, watched through the stream (shared 2-rank set)."""

import math
import time

import pytest

from workbench.engine import control, trainer
from workbench.notebook import stream, training
from workbench.notebook.metrics import metrics

PARAM_BYTES = 139904  # GPT tiny (seq 32): 34976 fp32 parameters
ROOT_BYTES = 65664  # of them outside the blocks: embedding, output head (256 x 32 each) and final norm


@pytest.fixture
def rs(current2):
    return current2


def wide(run):
    return metrics(run, wide=True)


def test_50_steps_stream_every_step_of_every_rank_once(rs):
    store = stream.attach(rs).store
    # the shared set's stream has served earlier tests (a rollback re-sends its steps):
    # count the gaps and duplicates of this run only
    before = (store.gaps, store.duplicates)
    training.setup("ddp", rankset=rs)
    run = training.start(50, rankset=rs)
    assert training.wait(timeout=120, rankset=rs) == {0: "finished", 1: "finished"}
    tidy = metrics(run)
    assert list(tidy.columns[:5]) == ["run", "step", "rank", "metric", "value"]
    loss = tidy[tidy.metric == "loss"]
    for r in (0, 1):
        assert sorted(loss[loss["rank"] == r].step) == list(range(1, 51))
    assert (store.gaps, store.duplicates) == before
    w = wide(run)
    assert (w.memory_rss_bytes > 0).all() and (w.memory_uss_bytes.dropna() > 0).all()
    assert w.mfu.isna().all()  # CPU: no device peak, so no MFU
    # DDP: one comm-hook all-reduce per gradient bucket, covering every parameter's gradient;
    # the ranks' agreement (flags and loss) is the trainer's own, on its own group: not counted
    assert (w["comm/ddp_bucket/bytes"] == PARAM_BYTES).all()
    assert (w["comm/all_reduce/count"] == w["comm/ddp_bucket/count"]).all()
    assert (w["comm/all_reduce/bytes"] == PARAM_BYTES).all()
    assert (w["comm/all_reduce/time_s"] > 0).all()
    assert (w.time_control_s > 0).all()
    assert w.loss.iloc[-1] < w.loss.iloc[0]
    phases = w[[f"time_{p}_s" for p in ("data", "forward", "backward", "optimizer")]].sum(axis=1)
    assert (phases <= w.time_step_s * 1.01).all()


def test_pause_holds_resume_continues_stop_ends_at_one_step(rs):
    training.setup("ddp", rankset=rs)
    run = training.start(100_000, rankset=rs)
    training.wait(step=3, rankset=rs, timeout=60)
    training.pause(rankset=rs)
    training.wait("paused", rankset=rs, timeout=30)
    held = stream.attach(rs).store.run_state(run)
    assert held[0]["step"] == held[1]["step"]
    time.sleep(0.6)
    status = training.status(rankset=rs)
    assert [s["step"] for s in status] == [held[0]["step"]] * 2 and {s["state"] for s in status} == {"paused"}
    training.resume(rankset=rs)
    training.wait(step=held[0]["step"] + 3, rankset=rs, timeout=60)
    training.stop(rankset=rs)
    states = training.wait(rankset=rs, timeout=30)
    assert states == {0: "stopped", 1: "stopped"}
    last = stream.attach(rs).store.last_steps(run)
    assert last[0] == last[1] > held[0]["step"] + 2
    assert sorted(wide(run).step.unique()) == list(range(1, last[0] + 1))


def test_set_lr_shows_at_the_same_step_on_every_rank_right_after_the_running_one(rs):
    """The ranks agree on commands while a step runs (trainer doc): ``set`` lands at the
    next step, or at the one after when it reached the ranks after the running step's
    agreement had started. ``t_set`` is the last step completed when ``set`` returned, so
    the running step is ``t_set + 1`` and the new lr shows at ``t_set + 3`` at the latest."""
    training.setup("ddp", rankset=rs, lr=1e-3)
    run = training.start(100_000, rankset=rs)
    training.wait(step=2, rankset=rs, timeout=60)
    with pytest.raises(Exception, match="not a hyperparameter"):
        training.set(rs, lr_typo=1.0)
    training.set(rs, lr=3e-4, grad_clip=0.5)
    t_set = max(r["step"] for r in training.status(rankset=rs))
    training.wait(step=t_set + 3, rankset=rs, timeout=60)
    training.stop(rankset=rs)
    training.wait(rankset=rs, timeout=30)
    w = wide(run)
    first_new = {r: w[(w["rank"] == r) & (w.lr == 3e-4)].step.min() for r in (0, 1)}
    assert first_new[0] == first_new[1] <= t_set + 3
    for r in (0, 1):
        lr = w[w["rank"] == r].sort_values("step").lr.tolist()
        k = first_new[r] - 1
        assert set(lr[:k]) == {1e-3} and set(lr[k:]) == {3e-4}


def test_fsdp2_reports_all_gathers_and_reduce_scatters_with_accumulation(rs):
    training.setup("fsdp2", rankset=rs, grad_accum=2)
    run = training.start(4, rankset=rs)
    training.wait(rankset=rs, timeout=120)
    w = wide(run)
    assert len(w) == 8
    # per micro-batch: 2 blocks all-gathered for forward and again for backward, the root
    # once (it keeps its parameters gathered from forward into backward)
    assert (w["comm/all_gather/count"] == 10).all()
    assert (w["comm/all_gather/bytes"] == 2 * (2 * PARAM_BYTES - ROOT_BYTES)).all()
    # gradient sync only on the last micro-batch: one reduce-scatter per FSDP module
    assert (w["comm/reduce_scatter/count"] == 3).all()
    assert (w["comm/reduce_scatter/bytes"] == PARAM_BYTES).all()
    assert (w.tps > 0).all() and (w.grad_norm > 0).all()


def test_nan_loss_pauses_at_that_step_and_skips_the_update(rs):
    training.setup("ddp", rankset=rs)
    training.inject("nan", 5, ranks=[1], rankset=rs)
    run = training.start(20, rankset=rs)
    states = training.wait("paused", rankset=rs, timeout=60)
    assert states == {0: "paused", 1: "paused"}
    st = stream.attach(rs).store.run_state(run)
    assert st[0]["step"] == st[1]["step"] == 5
    assert "non-finite" in st[0]["reason"] and "step 5" in st[1]["reason"]
    time.sleep(0.3)
    w = wide(run)
    assert w.step.max() == 5 and math.isnan(w[w.step == 5].loss.iloc[0])
    training.resume(rankset=rs)
    training.wait(step=7, rankset=rs, timeout=60)
    training.stop(rankset=rs)
    training.wait(rankset=rs, timeout=30)
    w = wide(run)
    assert w[w.step == 6].loss.map(math.isfinite).all()  # the NaN step did not poison the weights


def test_loss_spike_beyond_factor_of_recent_median_pauses(rs):
    training.setup("none", rankset=rs, spike_window=5)
    run = training.start(1000, rankset=rs)
    training.wait(step=6, rankset=rs, timeout=60)
    training.set(rs, spike_factor=0.5)  # every loss is now a "spike" against the median
    training.wait("paused", rankset=rs, timeout=60)
    st = stream.attach(rs).store.run_state(run)
    assert st[0]["step"] == st[1]["step"] and "loss spike" in st[0]["reason"] and "0.5 x median" in st[0]["reason"]
    training.stop(rankset=rs)
    training.wait(rankset=rs, timeout=30)


def test_hook_sees_every_step_and_can_pause_everyone(rs):
    training.setup("none", rankset=rs)

    def add_hook():
        t = trainer.current()
        t.seen = []

        def hook(rec):
            t.seen.append(rec["step"])
            if rec["step"] == 4 and t.rank == 1:
                t.pause("hook on rank 1")

        t.add_hook(hook)
        return True

    rs.apply(add_hook)
    run = training.start(50, rankset=rs)
    training.wait("paused", rankset=rs, timeout=60)
    assert rs.apply(lambda: trainer.current().seen) == [[1, 2, 3, 4]] * 2
    assert stream.attach(rs).store.run_state(run)[1]["reason"] == "hook on rank 1"
    training.stop(rankset=rs)
    training.wait(rankset=rs, timeout=30)


def _count_agreements(pauses: bool, transport: str) -> str:
    """On each rank: count the trainer's extra flag agreements, made through ``transport``."""
    from workbench.engine import agreement

    t = trainer.current()
    if transport == "gloo" and t._agreement.board is not None:  # as for ranks on several hosts
        ch = agreement.gloo_channel()
        t._agreement = agreement.Agreement(ch, t._agreement.generation, None, t.world_size)
    t.extra = 0
    if not hasattr(t, "counted"):
        flags = t._agreement.flags

        def counted(local):
            t.extra += 1
            return flags(local)

        t._agreement.flags = t.counted = counted
    t.add_hook(lambda rec: None, every=2, pauses=pauses)
    return t._agreement.transport


@pytest.mark.parametrize("transport", ["shared memory", "gloo"])
def test_one_agreement_per_step_unless_a_hook_that_may_pause_ran(rs, transport):
    """The flags and the loss are agreed in one exchange per step (shared memory on one host,
    gloo across hosts: both run here); a second agreement follows only steps where a hook that
    may pause ran (so its pause lands at the next step)."""
    training.setup("ddp", rankset=rs)
    for pauses, extra in ((False, 1), (True, 1 + 3)):  # 1: the agreement before the first step
        assert rs.apply(_count_agreements, pauses, transport) == [transport] * 2
        training.start(6, rankset=rs)
        assert training.wait(rankset=rs, timeout=60) == {0: "finished", 1: "finished"}
        assert rs.apply(lambda: trainer.current().extra) == [extra, extra], pauses
        rs.apply(lambda: trainer.current().hooks.clear())


def test_user_loop_reports_with_one_call(rs):
    store = stream.attach(rs).store
    rs.execute(
        "from workbench import engine\n"
        "for i in range(1, 6):\n"
        "    engine.report(step=i, loss=1.0 / i, run='user-loop', accuracy=0.1 * i)\n"
        "from workbench.engine import publisher\npublisher.flush()\n",
        timeout=60,
    )
    assert store.wait(lambda s: len(s.snapshot_rows("user-loop")) == 10, timeout=10)
    tidy = metrics("user-loop")
    acc = tidy[tidy.metric == "accuracy"]
    assert len(acc) == 10 and set(tidy.source) == {"user"}
    assert (tidy[tidy.metric == "memory_rss_bytes"].value > 0).all()


def test_no_trainer_is_a_clear_error(rs):
    with pytest.raises(Exception, match="no trainer on this rank"):
        rs.apply(control.start, 3)


def _listen():
    """On each rank: a listener that records what the trainer announces."""
    from workbench.engine import listeners

    class Recorder(listeners.TrainerListener):
        def __init__(self):
            self.seen = []

        def trainer_built(self, trainer):
            self.seen.append(("built", trainer.run))

        def step_begun(self, trainer, step):
            self.seen.append(("begun", step))

        def step_ended(self, trainer, record):
            self.seen.append(("ended", record["step"], math.isfinite(record["loss"])))

        def state_changed(self, trainer, state, reason):
            self.seen.append(("state", state))

    listeners.RECORDER = Recorder()
    listeners.subscribe(listeners.RECORDER)


def _heard():
    from workbench.engine import listeners

    listeners.unsubscribe(listeners.RECORDER)
    return listeners.RECORDER.seen, trainer.current().run


def test_trainer_announces_itself_its_steps_and_states_to_listeners(rs):
    rs.apply(_listen)
    training.setup("ddp", rankset=rs)
    training.start(3, rankset=rs)
    assert training.wait(rankset=rs, timeout=60) == {0: "finished", 1: "finished"}
    for seen, run in rs.apply(_heard):
        assert seen == [
            ("built", run),
            ("state", "running"),
            ("begun", 1),
            ("ended", 1, True),
            ("begun", 2),
            ("ended", 2, True),
            ("begun", 3),
            ("ended", 3, True),
            ("state", "finished"),
        ]


def _capabilities(accum: int):
    from workbench.strategies.base import Prepared

    t = trainer.current()
    p = t.prepared
    return {
        "own_train_step": p.own_train_step,
        "reduce_scatter": p.reduce_scatter,
        "engine_state": p.engine_state,
        "whole_step": t._whole_step,
        "gloo_note": any("gloo has no real reduce-scatter" in n for n in t.notes),
        "own_no_sync": type(p).no_sync is not Prepared.no_sync,
    }


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2", "zero"])
def test_strategy_capabilities_pick_the_trainer_path_on_real_ranks(rs, strategy):
    """The trainer picks its step, its gradient-sync skipping and its notes from what the
    Prepared declares: ddp and fsdp2 run the trainer's decomposed step (fsdp2 reduce-scatters,
    with its own no-sync), zero runs DeepSpeed's own step and keeps its state in the engine."""
    if strategy == "zero":
        pytest.importorskip("deepspeed")
    training.setup(strategy, rankset=rs, grad_accum=2)
    caps = rs.apply(_capabilities, 2)
    assert caps[0] == caps[1]
    want = {
        "ddp": dict(
            own_train_step=False,
            reduce_scatter=False,
            engine_state=False,
            whole_step=False,
            gloo_note=False,
            own_no_sync=False,
        ),
        "fsdp2": dict(
            own_train_step=False,
            reduce_scatter=True,
            engine_state=False,
            whole_step=False,
            gloo_note=True,
            own_no_sync=True,
        ),
        "zero": dict(
            own_train_step=True,
            reduce_scatter=False,
            engine_state=True,
            whole_step=True,
            gloo_note=False,
            own_no_sync=False,
        ),
    }[strategy]
    assert caps[0] == want
    run = training.start(2, rankset=rs)
    assert training.wait(rankset=rs, timeout=120) == {0: "finished", 1: "finished"}
    if strategy == "ddp":  # gradients all-reduced on the last micro-batch only (DDP's no_sync on the first)
        w = wide(run)
        assert (w["comm/all_reduce/count"] == 1).all() and (w["comm/all_reduce/bytes"] == PARAM_BYTES).all()
