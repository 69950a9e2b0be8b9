"""Tier 2: the session's stream mirrored into TensorBoard, MLflow, W&B (offline) and trackio
while the workbench's trainer runs on the shared 2-rank set, each read back with that
tracker's own reader, compared with ``workbench.metrics()``. Nothing leaves the machine."""

import glob
import os

import pytest
import tracker_readers

from workbench.notebook import checkpoints, stream, trackers, training
from workbench.notebook import session as sessions
from workbench.notebook.metrics import metrics

STEPS = 6


@pytest.fixture
def tracked(current2, tmp_path):
    """The shared set current, its checkpoints in tmp_path; no tracker left open after."""
    sess = sessions.current()
    before = sess.checkpoints.root
    sess.checkpoints.root = str(tmp_path / "ckpt")
    try:
        yield current2, tmp_path
    finally:
        for kind in list(sess.trackers.by_kind):
            sess.trackers.by_kind.pop(kind).close()
        sess.checkpoints.root = before
        import wandb

        wandb.teardown()  # ends the W&B service process wandb.init started in this process


def per_rank(frame, metric):
    """{rank: [(step, value)...]} and the mean per step of one metric of workbench.metrics()."""
    rows = frame[frame.metric == metric]
    ranks = {r: list(zip(g.step, g.value)) for r, g in rows.groupby("rank")}
    mean = list(rows.groupby("step").value.mean().items())
    return ranks, mean


def test_four_trackers_hold_the_runs_loss_per_rank_and_mean_params_and_checkpoint(tracked):
    rs, tmp = tracked
    stream.attach(rs)
    # MLflow's SQLite store takes ~1 ms a value and the shared set's earlier runs are mirrored
    # too: it gets the loss and lr only (--metrics), the others every metric
    dirs = {kind: tmp / kind for kind in trackers.KINDS} | {"trackio": tracker_readers.trackio_dir(tmp / "trackio")}
    opened = {kind: trackers.track(kind, str(dirs[kind])) for kind in trackers.KINDS if kind != "mlflow"}
    opened["mlflow"] = trackers.track("mlflow", str(tmp / "mlflow"), metrics="loss*,lr")
    assert trackers.track("mlflow", str(tmp / "mlflow"), metrics="loss*,lr") is opened["mlflow"]  # the same again
    with pytest.raises(trackers.TrackerError, match="already mirrors to mlflow in .* with metrics loss\\*,lr"):
        trackers.track("mlflow", str(tmp / "mlflow"))  # every metric: not what runs, refused
    training.setup("ddp", rankset=rs)
    run = training.start(STEPS, rankset=rs)
    assert training.wait(rankset=rs, timeout=120) == {0: "finished", 1: "finished"}
    saved = checkpoints.save(rankset=rs)
    assert stream.attach(rs).store.wait(lambda s: len(s.snapshot_rows(run)) == 2 * STEPS, timeout=10)
    ended = {info["tracker"]: info for info in trackers.untrack()}
    assert trackers.tracking() == []
    # the shared set's earlier runs (other tests) are in its store too, and mirrored as well
    assert {k: i["errors"] for k, i in ended.items()} == {k: [] for k in trackers.KINDS}
    assert all(i["steps"] >= STEPS for i in ended.values())
    ranks, mean = per_rank(metrics(run), "loss")
    assert sorted(ranks) == [0, 1] and [s for s, _ in ranks[0]] == list(range(1, STEPS + 1))
    want = {f"{run}/loss/rank{r}": series for r, series in ranks.items()} | {f"{run}/loss/mean": mean}
    ckpt_name = os.path.basename(saved["path"]) if "path" in saved else None

    # TensorBoard: its own event reader (scalars are float32 in TensorBoard's format)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(str(tmp / "tensorboard"), ended["tensorboard"]["run"]))
    acc.Reload()
    for tag, series in want.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in series]
        assert [v for _, v in got] == pytest.approx([v for _, v in series], rel=1e-6)
    assert "parameters" in acc.Tags()["tensors"]
    assert f"{run}/tps/rank1" in acc.Tags()["scalars"] and f"{run}/comm/all_reduce/bytes/mean" in acc.Tags()["scalars"]

    # MLflow: its client on the SQLite store; parameters and the checkpoint as an artifact
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow'}/mlflow.db")
    (mrun,) = client.search_runs([client.get_experiment_by_name("workbench").experiment_id])
    for key, series in want.items():
        assert sorted((m.step, m.value) for m in client.get_metric_history(mrun.info.run_id, key)) == series
    assert set(mrun.data.metrics) >= set(want) and not any("/tps/" in k for k in mrun.data.metrics)
    params = mrun.data.params
    assert params["world_size"] == "2" and params[f"{run}/strategy"] == "ddp" and params[f"{run}/source"] == "trainer"
    assert mrun.info.status == "FINISHED"
    arts = [a.path for a in client.list_artifacts(mrun.info.run_id, "checkpoints")]
    assert len(arts) == 1 and (ckpt_name is None or arts[0].endswith(ckpt_name))
    assert client.list_artifacts(mrun.info.run_id, arts[0])  # its files were copied

    # W&B offline: the run's datastore file, read record by record with wandb's protobuf schema
    (wfile,) = glob.glob(str(tmp / "wandb" / "wandb" / "offline-run-*" / "run-*.wandb"))
    rows = tracker_readers.history(wfile)
    for key, series in want.items():
        assert [(r[f"{run}/step"], r[key]) for r in rows if key in r] == series
    config = tracker_readers.config(wfile)
    assert config["world_size"] == 2 and config[f"{run}/strategy"] == "ddp"
    assert len(tracker_readers.artifacts(wfile)) == 1

    # trackio: its local store's reader
    from trackio.sqlite_storage import SQLiteStorage

    logs = SQLiteStorage.get_logs("workbench", ended["trackio"]["run"])
    for key, series in want.items():
        assert [(r["step"], r[key]) for r in logs if key in r] == series


def test_stop_of_a_tracker_not_open_is_one_clear_message(shell2):
    from workbench.notebook.commands import UsageError

    with pytest.raises(UsageError, match="has no open mlflow tracker; open: none"):
        shell2.run_line_magic("distrain", "track stop mlflow")
    assert shell2.run_line_magic("distrain", "track list") == []
