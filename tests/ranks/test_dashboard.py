"""The dashboard and the train magics on real ranks (shared sets, left clean)."""

import pytest
from conftest import clean_trainer

from workbench.notebook import session, stream, training
from workbench.notebook.dashboard import Dashboard
from workbench.shared.checkpoint import catalog


@pytest.fixture
def rs(ranks2):
    yield ranks2
    ranks2.apply(clean_trainer, timeout=60)


def test_dashboard_figures_hold_every_point_of_the_run_and_export(rs, tmp_path):
    training.setup("ddp", rankset=rs)
    run = training.start(30, rankset=rs)
    dash = Dashboard(rs, run=run, live=False)
    training.wait(rankset=rs, timeout=120)
    assert dash.refresh()
    loss = {t.name: t for t in dash.panel("loss")}
    assert set(loss) == {"rank 0", "rank 1", "mean"}
    assert all(list(t.x) == list(range(1, 31)) for t in loss.values())
    # arrays, which plotly sends as binary buffers: lists it validated and JSON-encoded
    # point by point (a redraw took ~14 ms at 400 steps, growing with the run)
    assert all(type(t.x).__name__ == "ndarray" and t.y.dtype.kind == "f" for t in loss.values())
    for key in ("throughput", "memory", "comm", "step_time", "grad_norm"):
        drawn = [t for t in dash.panel(key) if t.x is not None and len(t.x)]
        assert drawn and all(len(t.x) == 30 for t in drawn), key  # every panel has data, one point a step
    comm = {t.name for t in dash.panel("comm")}
    assert {"all_reduce r0", "all_reduce r1"} <= comm
    assert {t.name for t in dash.panel("step_time")} >= {"data", "forward", "backward", "optimizer"}
    # each panel draws on its own axes: the loss lines are not on the throughput axes
    assert {(t.xaxis, t.yaxis) for t in dash.panel("loss")} == {("x", "y")}
    assert {(t.xaxis, t.yaxis) for t in dash.panel("throughput")} == {("x2", "y2")}
    with pytest.raises(KeyError, match="the panels are loss, throughput"):
        dash.panel("losses")
    assert "step 30" in dash.controls.status.value and "finished" in dash.controls.status.value
    last_lr = [r["lr"] for r in dash.store.snapshot_rows(run) if r["step"] == 30][0]
    assert f" lr {last_lr:.3g} " in dash.controls.status.value
    assert "mfu n/a" in dash.controls.status.value
    assert dash.controls.lr.value == last_lr  # the lr box shows the run's lr until the user types one
    assert not dash.refresh()  # nothing new: no redraw
    # shown twice: one live copy, where it was shown last; the first output says so
    from IPython.testing.globalipapp import get_ipython
    from IPython.utils.capture import capture_output

    formatter = get_ipython().display_formatter  # display() publishes through a real shell
    active, formatter.active_types = formatter.active_types, ["text/plain", "text/html"]  # as a kernel's
    try:
        with capture_output() as shown:
            dash.show()
            dash.show()
    finally:
        formatter.active_types = active
    views = [o for o in shown.outputs if "application/vnd.jupyter.widget-view+json" in o.data]
    assert len(views) == 2 and not any(o.update for o in views)
    ids = [o.transient["display_id"] for o in views]
    moved = [o for o in shown.outputs if o.update]
    assert len(moved) == 1 and moved[0].transient["display_id"] == ids[0] != ids[1]
    assert "dashboard moved" in moved[0].data["text/html"]
    assert not dash.controls.checkpoint.disabled  # saves into the session's checkpoints folder
    path = dash.export_html(tmp_path / "run.html")
    text = open(path, encoding="utf-8").read()
    assert text.count("Plotly.newPlot") == 1 and "plotly.js" in text.lower() and run in text
    assert len(text) > 1_000_000  # plotly.js inlined: opens offline


def test_controls_drive_the_run_and_checkpoint_button_saves_and_a_nan_pause_shows_the_rollback(rs, tmp_path):
    sess = session.of(rs)
    sess.checkpoints.root = root = str(tmp_path / "ck")  # this session's folder (`ckpt dir`)
    try:
        training.setup("ddp", rankset=rs)
        run = training.start(100_000, rankset=rs)
        dash = Dashboard(rs, run=run, live=True, interval=0.1)
        training.wait(step=2, rankset=rs, timeout=60)
        dash.controls.pause.click()
        assert training.wait("paused", rankset=rs, timeout=30) == {0: "paused", 1: "paused"}
        dash.controls.lr.value = 5e-4
        dash.controls.set_lr.click()
        dash.controls.checkpoint.click()
        assert "checkpoint saved" in dash.controls.message.value, dash.controls.message.value
        at = max(stream.attach(rs).store.last_steps(run).values())
        saved = catalog.entries(root)
        assert [m.step for _, m in saved] == [at] and dash.controls.last_checkpoint["step"] == at
        assert "wb-rollback-hint" not in dash.status_line(run)  # paused from the notebook: no hint
        training.inject("nan", at + 2, rankset=rs)  # the trainer pauses on the non-finite loss
        dash.controls.resume.click()
        store = stream.attach(rs).store
        assert store.wait(lambda s: "non-finite" in str(s.run_state(run)), 60)
        line = dash.status_line(run)
        name = saved[0][0].rsplit("/", 1)[1]
        assert "wb-rollback-hint" in line and "the loss is NaN/Inf" in line
        assert f"`%distrain ckpt load latest` rolls back to {name} (step {at}" in line
        dash.controls.resume.click()  # no stop while paused on NaN: resume first, then stop
        training.wait(step=at + 4, rankset=rs, timeout=60)
        dash.controls.stop.click()
        training.wait(rankset=rs, timeout=30)
        assert dash.store.wait(lambda s: dash.redraws > 1 and "stopped" in dash.controls.status.value, 5)
        dash.close()
        assert 5e-4 in {r["lr"] for r in stream.attach(rs).store.snapshot_rows(run)}
    finally:
        sess.checkpoints.root = None


def test_train_magics_on_four_ranks(shell, ranks4, capsys, tmp_path):
    try:
        r = shell.run_cell("%distrain train start --steps 12 --gpt tiny --strategy ddp --no-dashboard")
        assert r.success, r.error_in_exec
        r = shell.run_cell("%distrain train wait")
        assert r.success and r.result == {0: "finished", 1: "finished", 2: "finished", 3: "finished"}
        r = shell.run_cell("%distrain train set lr_typo=1")
        assert not r.success and "not a hyperparameter" in str(r.error_in_exec)
        r = shell.run_cell("%distrain train set lr=2e-4 betas=0.8,0.9")
        assert r.success
        r = shell.run_cell("%distrain train pause now")
        assert not r.success and "unrecognized arguments: now" in str(r.error_in_exec)
        r = shell.run_cell(f"%distrain dashboard --export {tmp_path / 'd.html'}")
        assert r.success and (tmp_path / "d.html").stat().st_size > 1_000_000
        r = shell.run_cell("%distrain train status")
        assert r.success and list(r.result.state) == ["finished"] * 4
        import workbench

        tidy = workbench.metrics()
        assert sorted(tidy["rank"].unique()) == [0, 1, 2, 3]
        assert len(tidy[tidy.metric == "loss"]) == 48
        workbench.export_metrics(tmp_path / "m.parquet")
        workbench.export_metrics(tmp_path / "m.csv")
        import pandas as pd

        # by value: the files hold the frame metrics() gives, row for row
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "m.parquet"), tidy.reset_index(drop=True))
        from_csv = pd.read_csv(tmp_path / "m.csv")
        assert list(from_csv.columns) == list(tidy.columns) and len(from_csv) == len(tidy)
        numeric = [c for c in tidy.columns if pd.api.types.is_numeric_dtype(tidy[c])]
        pd.testing.assert_frame_equal(from_csv[numeric], tidy[numeric].reset_index(drop=True), check_dtype=False)
    finally:
        ranks4.apply(clean_trainer, timeout=60)
    out, _ = capsys.readouterr()
    assert "12 steps on 4 ranks" in out and "lr=0.0002" in out
