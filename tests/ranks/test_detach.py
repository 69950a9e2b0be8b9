"""``%distrain detach`` / ``attach``: a run that outlives its kernel, taken back by another one.

Real kernels (jupyter_client), the first killed by pid with SIGKILL as an out-of-memory kill or
a crashed server would end it; the set keeps training under its keeper process, and a new
kernel attaches and finds every step. Fresh rank sets: their kernels die.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import ROOT, alive
from jupyter_client.manager import start_new_kernel
from kernel_runs import execute, printed

from workbench.notebook import handoff, registry

STEPS = 300


def _run(kc, code: str, timeout: float = 300, *, widgets: list | None = None) -> str:
    reply, msgs = execute(kc, textwrap.dedent(code), timeout=timeout)
    out = printed(msgs)
    assert reply["status"] == "ok", out
    if widgets is not None:  # the widget views the cell displayed (the dashboard)
        widgets += [m for _, m in msgs if "application/vnd.jupyter.widget-view+json" in m["content"].get("data", {})]
    return out


def _line(out: str, tag: str) -> dict:
    (line,) = [x for x in out.splitlines() if x.startswith(tag + " ")]
    return json.loads(line[len(tag) + 1 :])


def _kill_kernel(km, kc) -> None:
    kc.stop_channels()
    km.shutdown_kernel(now=True)


def test_a_detached_run_trains_on_while_its_kernel_is_killed_and_a_new_kernel_sees_every_step(tmp_path):
    env = dict(os.environ)
    km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=str(tmp_path))
    km2 = kc2 = None
    held: list[int] = []
    try:
        out = _run(
            kc,
            f"""
            %load_ext workbench
            import json, os, workbench
            from workbench.notebook import stream
            # a small window: rows spill to the Parquet history before, while and after detached
            stream.WINDOW_ROWS, stream.HISTORY_PART_ROWS = 200, 100
            PACE = "import time\\nfrom workbench.engine import trainer\\ntrainer.current().add_hook(lambda record: time.sleep(0.03), pauses=False)"
            %distrain start -n 2 --session night --backend gloo --threads 1
            workbench.train.setup("ddp", model="tiny")
            # each step at least 30 ms: the run is still going when its kernel is killed
            workbench.run(PACE, display=False)
            %distrain train start --steps {STEPS} --no-dashboard
            workbench.train.wait(step=5, timeout=240)
            pids = sorted(workbench.current().started_pids)
            before = int(workbench.metrics().step.max())
            %distrain detach
            entry = workbench.detached()["night"]
            print("SET " + json.dumps({{"kernel": os.getpid(), "pids": pids, "keeper": entry["keeper_pid"], "before": before}}))
            """,
        )
        assert "detached 'night': 2 ranks held by keeper pid" in out, out
        info = _line(out, "SET")
        held = [*info["pids"], info["keeper"]]
        assert info["before"] < STEPS
        killed_at = time.time()
        os.kill(info["kernel"], signal.SIGKILL)  # by pid: no atexit, no clean-up in the kernel
        _kill_kernel(km, kc)
        time.sleep(3.0)  # a set that was not detached ends within a second or two (test_orphans)
        assert alive(held) == held, f"the detached set lost processes with its kernel: {set(held) - set(alive(held))}"

        km2, kc2 = start_new_kernel(kernel_name="python3", env=env, cwd=str(tmp_path))
        shown: list = []
        out = _run(
            kc2,
            """
            %load_ext workbench
            import json, os, time, workbench
            attached_at = time.time()
            %distrain attach --session night
            """,
            widgets=shown,
        )
        assert "attached 'night': 2 ranks; run run-" in out, out
        assert shown, "attach showed no dashboard"
        out = _run(
            kc2,
            """
            print("RANKS " + json.dumps(workbench.apply(os.getpid)))  # the same ranks, answering here
            workbench.train.wait(timeout=300)
            loss = workbench.metrics(None)
            loss = loss[loss.metric == "loss"]
            steps = {r: sorted(int(s) for s in loss[loss["rank"] == r].step) for r in (0, 1)}
            times = {r: [float(t) for t in loss[loss["rank"] == r].time] for r in (0, 1)}
            store = workbench.session().store
            parts = store.history.parts()
            print("SEEN " + json.dumps({"steps": steps, "times": times, "attached_at": attached_at,
                                        "spilled": store.spilled, "window": len(store.rows), "parts": len(parts),
                                        "on_disk": all(os.path.isfile(p) for p in parts)}))
            """,
        )
        rank_pids = _line(out, "RANKS")
        assert len(set(rank_pids)) == 2 and set(rank_pids) <= set(info["pids"]), out
        seen = _line(out, "SEEN")
        for rank in ("0", "1"):
            assert seen["steps"][rank] == list(range(1, STEPS + 1)), f"rank {rank}: not every step exactly once"
            unattended = [t for t in seen["times"][rank] if killed_at < t < seen["attached_at"]]
            assert unattended, f"rank {rank} trained no step between the kernel's death and the attach"
        assert info["keeper"] not in alive([info["keeper"]]), "the keeper stays after the set was taken back"
        # steps 1..N above came back through the Parquet history (the window holds 200 rows):
        # the parts the first kernel, the keeper and this kernel wrote, one dataset
        assert seen["window"] <= 200 + 2 and seen["spilled"] > 0, seen
        assert seen["spilled"] + seen["window"] >= 2 * STEPS, seen
        assert seen["on_disk"] and seen["parts"] >= 2, seen

        out = _run(kc2, "%distrain stop --session night")
        assert "ranks stopped" in out, out
        assert alive(held) == [], f"processes left behind: {alive(held)}"
        assert not [e for e in registry.read_all() if e.get("name") == "night" or e.get("kernel_pid") == info["keeper"]]
    finally:
        for manager, client in ((km, kc), (km2, kc2)):
            if manager is not None and manager.is_alive():
                _kill_kernel(manager, client)
        for pid in alive(held):
            os.kill(pid, signal.SIGKILL)


HEADLESS = """
import json, sys, time
sys.path.insert(0, {root!r})
import workbench
from workbench.notebook import handoff
rs = workbench.start(2, backend="gloo", threads=1, session="overnight")
busy = rs.execute_async("import time; time.sleep(4)")
time.sleep(0.5)
try:
    workbench.detach("overnight")
except handoff.DetachError as exc:
    print("REFUSED " + json.dumps(str(exc)), flush=True)
busy.result(timeout=60)
rs.execute("still_here = 7")
entry = workbench.detach("overnight")
print("SET " + json.dumps({{"pids": sorted(rs.started_pids), "entry": entry}}), flush=True)
"""  # then exits normally: the atexit clean-up of a process must not stop a set it detached


def test_a_detached_set_is_listed_refused_while_busy_and_stopped_from_another_process(ipshell, capsys):
    proc = subprocess.run(
        [sys.executable, "-c", HEADLESS.format(root=str(ROOT))],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    refused = json.loads(proc.stdout.split("REFUSED ", 1)[1].splitlines()[0])
    assert "ranks 0-1 of 'overnight' are running a cell" in refused and "Nothing was changed" in refused
    info = _line(proc.stdout, "SET")
    entry = info["entry"]
    keeper = entry["keeper_pid"]
    held = [*info["pids"], keeper]
    try:
        assert alive(held) == held, "the set did not outlive the process that detached it"
        # the owner file is the keeper's registry entry, which the Lab extension reads
        (listed,) = [e for e in registry.read_all() if e.get("name") == "overnight"]
        assert listed["detached"] is True and listed["kernel_pid"] == keeper and not listed["stale"]
        assert sorted(handoff.detached_sets()) == ["overnight"]

        capsys.readouterr()
        ipshell.run_line_magic("distrain", "sessions")
        assert (
            f"overnight: 2 ranks, detached (keeper pid {keeper}): `%distrain attach --session overnight`"
            in capsys.readouterr().out
        )

        with pytest.raises(handoff.DetachError) as err:
            ipshell.run_line_magic("distrain", "attach --session nope")
        assert str(err.value).startswith("there is no detached rank set named 'nope'; the detached sets are: overnight")

        ipshell.run_line_magic("distrain", "stop --session overnight")
        assert alive(held) == [], f"processes left behind: {alive(held)}"
        assert handoff.detached_sets() == {} and registry.read(listed["id"]) is None
    finally:
        for pid in alive(held):
            os.kill(pid, signal.SIGKILL)


BUDGET = """
import json, os, signal, sys, time
sys.path.insert(0, {root!r})
import workbench
from workbench.notebook import api, training
from workbench.notebook import checkpoints as ck
rs = workbench.start(2, backend="gloo", threads=1, session="budget")
training.setup("ddp", rankset=rs)
ck.autosave(10, keep=3, async_=False, root={ckpt!r}, rankset=rs)
# every step at least 30 ms; rank 1 ends itself with SIGKILL at its first step from 40 on once
# it ends with the keeper (the set is detached): the failure comes while no kernel is attached
api.run('''
import os, signal, time
from workbench.engine import runtime, trainer as _t
_first_owner = runtime._OWNER[0]
def _pace_then_crash(record):
    time.sleep(0.03)
    if record["step"] >= 40 and runtime._OWNER[0] != _first_owner and _t.current().rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
_t.current().add_hook(_pace_then_crash, pauses=False)
''', display=False)
training.start(200, max_failures=1, rankset=rs)
training.wait(step=3, timeout=240)
entry = workbench.detach("budget")
print("SET " + json.dumps({{"pids": sorted(rs.started_pids), "entry": entry}}), flush=True)
"""


def test_the_failure_budget_recovers_a_detached_run_and_the_attached_kernel_sees_the_recovery(tmp_path):
    """The keeper runs the failure budget's supervisor: a rank killed while no kernel is attached
    is recovered there, and the kernel that attaches gets the recovery record and every step once."""
    from workbench.notebook import api, metrics, session, training

    proc = subprocess.run(
        [sys.executable, "-c", BUDGET.format(root=str(ROOT), ckpt=str(tmp_path / "ckpt"))],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = _line(proc.stdout, "SET")
    keeper = info["entry"]["keeper_pid"]
    first = {r["pid"] for r in info["entry"]["ranks"]}
    held = [*info["pids"], keeper]
    sess = None
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # the keeper's recovery starts a new set: a new owner entry
            entry = handoff.detached_sets().get("budget")
            if entry is not None and not first & {r["pid"] for r in entry["ranks"]}:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"no recovery while detached; the keeper's log: {_keeper_log(info)}")
        held += [r["pid"] for r in entry["ranks"]] + list(entry["controller_pids"])
        sess = handoff.attach("budget")
        held += list(sess.rankset.started_pids)
        assert training.wait(timeout=300, rankset=sess.rankset) == {0: "finished", 1: "finished"}
        (rec,) = sess.recoveries
        assert (rec["kind"], rec["rank"], rec["detail"]) == ("died", 1, "killed by SIGKILL"), rec
        assert rec["failed_step"] >= 40 and rec["checkpoint_step"] % 10 == 0, rec
        assert 0 <= rec["steps_redone"] <= 10, rec  # at most the save interval
        assert sess.runs.current is not None and sess.runs.current.failures == 1
        loss = metrics.metrics(store=sess.store)
        loss = loss[loss.metric == "loss"]
        for rank in (0, 1):
            assert sorted(loss[loss["rank"] == rank].step) == list(range(1, 201)), f"rank {rank}"
    finally:
        if sess is not None and sess.running:
            api.stop("budget")
        session.KERNEL.by_name.pop("budget", None)
        if "budget" in handoff.detached_sets():
            handoff.stop("budget")
        left = alive(held)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert left == [], f"processes left behind: {left}"


def _keeper_log(info: dict) -> str:
    """What the keeper printed (beside the set's stack folder)."""
    path = os.path.join(os.path.dirname(info["entry"]["stack_dir"]), "keeper", "keeper.log")
    try:
        with open(path) as f:
            return f.read()[-3000:]
    except OSError as exc:
        return str(exc)


TRACKED_STEPS = 150


def _tensorboard_events(logdir: str):
    """(the writer's pid, event) for every event of a TensorBoard run folder, each file read as
    written (a file's name ends ``.<host>.<pid>.<uid>``)."""
    import glob

    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2

    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        pid = int(os.path.basename(path).split(".")[-2])
        for raw in RawEventFileLoader(path).Load():
            yield pid, event_pb2.Event.FromString(raw)


def _tensorboard_steps(logdir: str, tags: list[str]) -> dict[str, list]:
    """Every scalar of ``tags`` in the run folder: ``{tag: [(writer's pid, step, value), ...]}``."""
    out: dict[str, list] = {t: [] for t in tags}
    for pid, event in _tensorboard_events(logdir):
        for v in event.summary.value:
            if v.tag in out:
                out[v.tag].append((pid, event.step, v.simple_value))
    return out


def test_trackers_write_on_from_the_keeper_and_come_back_on_attach_with_every_step_once(tmp_path, monkeypatch):
    """The four trackers (all offline here) opened before the detach: the keeper writes the
    steps trained after the kernel was killed into the same runs, and the kernel that attaches
    gets the trackers back; each tracker holds every step exactly once."""
    import tracker_readers

    tb, ml, wb = tmp_path / "tb", tmp_path / "mlflow", tmp_path / "wandb"
    tio = tracker_readers.trackio_dir(tmp_path / "trackio")  # this process reads it back
    if "trackio" not in sys.modules:  # trackio takes its folder from here when first imported
        monkeypatch.setenv("TRACKIO_DIR", str(tio))
    env = dict(os.environ)
    km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=str(tmp_path))
    km2 = kc2 = None
    held: list[int] = []
    try:
        out = _run(
            kc,
            f"""
            %load_ext workbench
            import json, os, workbench
            PACE = "import time\\nfrom workbench.engine import trainer\\ntrainer.current().add_hook(lambda record: time.sleep(0.05), pauses=False)"
            %distrain start -n 2 --session tracked --backend gloo --threads 1
            workbench.train.setup("ddp", model="tiny")
            workbench.run(PACE, display=False)
            %distrain track start tensorboard --dir {tb}
            %distrain track start mlflow --dir {ml} --metrics loss
            %distrain track start wandb --dir {wb} --metrics loss
            %distrain track start trackio --dir {tio} --metrics loss
            %distrain train start --steps {TRACKED_STEPS} --no-dashboard
            workbench.train.wait(step=5, timeout=240)
            pids = sorted(workbench.current().started_pids)
            runs = {{t["tracker"]: t["run"] for t in workbench.tracking()}}
            %distrain detach
            entry = workbench.detached()["tracked"]
            print("SET " + json.dumps({{"kernel": os.getpid(), "pids": pids, "keeper": entry["keeper_pid"],
                                        "runs": runs, "left": workbench.tracking()}}))
            """,
        )
        assert "trackers carried to the keeper (same runs): tensorboard, mlflow, wandb, trackio" in out, out
        info = _line(out, "SET")
        keeper = info["keeper"]
        held = [*info["pids"], keeper]
        assert info["left"] == [], "the detaching kernel still mirrors"
        os.kill(info["kernel"], signal.SIGKILL)
        _kill_kernel(km, kc)

        # the run finishes under the keeper, which writes it into the same TensorBoard run
        logdir = str(tb / info["runs"]["tensorboard"])
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            tags = [f"{r}/loss/rank{k}" for r in _scalar_runs(logdir) for k in (0, 1)]
            got = _tensorboard_steps(logdir, tags)
            if tags and all(v and max(s for _, s, _ in v) >= TRACKED_STEPS for v in got.values()):
                break
            time.sleep(1.0)
        else:
            pytest.fail(
                f"the keeper did not write the run's last step; its log: {_keeper_log({'entry': _entry_of(keeper)})}"
            )
        assert alive([keeper]) == [keeper]

        km2, kc2 = start_new_kernel(kernel_name="python3", env=env, cwd=str(tmp_path))
        out = _run(kc2, "%load_ext workbench\nimport json, workbench\n%distrain attach --session tracked")
        assert "trackers carried back (same runs): tensorboard, mlflow, wandb, trackio" in out, out
        out = _run(
            kc2,
            """
            workbench.train.wait(timeout=120)
            m = workbench.metrics(None)
            m = m[m.metric == "loss"]
            store = {r: [[int(s), float(v)] for s, v in zip(m[m["rank"] == r].step, m[m["rank"] == r].value)] for r in (0, 1)}
            run = str(m.run.iloc[0])
            ended = workbench.untrack()
            print("SEEN " + json.dumps({"store": store, "run": run, "ended": ended}))
            """,
        )
        seen = _line(out, "SEEN")
        _run(kc2, "%distrain stop --session tracked")
    finally:
        for manager, client in ((km, kc), (km2, kc2)):
            if manager is not None and manager.is_alive():
                _kill_kernel(manager, client)
        for pid in alive(held):
            os.kill(pid, signal.SIGKILL)
    assert alive(held) == []

    run, steps = seen["run"], list(range(1, TRACKED_STEPS + 1))
    store = {r: sorted(map(tuple, seen["store"][str(r)])) for r in (0, 1)}
    assert [s for s, _ in store[0]] == steps
    ended = {e["tracker"]: e for e in seen["ended"]}
    assert {k: (e["run"], e["errors"], e["steps"]) for k, e in ended.items()} == {
        k: (info["runs"][k], [], TRACKED_STEPS) for k in ("tensorboard", "mlflow", "wandb", "trackio")
    }

    # TensorBoard: the run folder's event files (the first kernel's, the keeper's), every step once
    written = _tensorboard_steps(logdir, [f"{run}/loss/rank{r}" for r in (0, 1)])
    for r in (0, 1):
        got = written[f"{run}/loss/rank{r}"]
        assert sorted(s for _, s, _ in got) == steps, f"rank {r}: not every step exactly once"
        assert [v for _, v in sorted((s, v) for _, s, v in got)] == pytest.approx([v for _, v in store[r]], rel=1e-6)
        by_file = {pid for pid, _, _ in got}
        assert {info["kernel"], keeper} <= by_file, by_file  # before the detach, and while detached

    # MLflow: one run, every step once, ended by the kernel that attached (FINISHED)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{ml}/mlflow.db")
    (mrun,) = client.search_runs([client.get_experiment_by_name("workbench").experiment_id])
    assert mrun.info.status == "FINISHED" and mrun.info.run_name == info["runs"]["mlflow"]
    for r in (0, 1):
        got = sorted((m.step, m.value) for m in client.get_metric_history(mrun.info.run_id, f"{run}/loss/rank{r}"))
        assert [s for s, _ in got] == steps, f"rank {r}: not every step exactly once in MLflow"
        assert [v for _, v in got] == pytest.approx([v for _, v in store[r]], rel=1e-6)

    # W&B offline: one run id, a folder per process that wrote (`wandb sync` uploads each into it)
    import glob

    files = sorted(glob.glob(str(wb / "wandb" / "offline-run-*" / "run-*.wandb")))
    assert len({os.path.basename(f) for f in files}) == 1, files
    for r in (0, 1):
        key = f"{run}/loss/rank{r}"
        parts = [[(row[f"{run}/step"], row[key]) for row in tracker_readers.history(f) if key in row] for f in files]
        got = sorted(x for part in parts for x in part)
        assert [s for s, _ in got] == steps, f"rank {r}: not every step exactly once in W&B"
        assert [v for _, v in got] == pytest.approx([v for _, v in store[r]], rel=1e-6)
        assert len([p for p in parts if p]) >= 2, "the keeper wrote nothing into the W&B run"

    # trackio: the one run, resumed where the set went
    from trackio.sqlite_storage import SQLiteStorage

    logs = SQLiteStorage.get_logs("workbench", info["runs"]["trackio"])
    for r in (0, 1):
        key = f"{run}/loss/rank{r}"
        got = sorted((row["step"], row[key]) for row in logs if key in row)
        assert [s for s, _ in got] == steps, f"rank {r}: not every step exactly once in trackio"
        assert [v for _, v in got] == pytest.approx([v for _, v in store[r]], rel=1e-6)


def _scalar_runs(logdir: str) -> set[str]:
    """The workbench runs with scalars in a TensorBoard run folder (the first part of each tag)."""
    runs = set()
    for _, event in _tensorboard_events(logdir):
        runs |= {v.tag.split("/")[0] for v in event.summary.value if v.WhichOneof("value") == "simple_value"}
    return runs


def _entry_of(keeper: int) -> dict:
    (entry,) = [e for e in registry.read_all() if e.get("keeper_pid") == keeper] or [{"stack_dir": "?/?"}]
    return entry


SETUP_FUNCTION = """
import json, os, sys, threading
sys.path.insert(0, {root!r})
import workbench
from workbench.notebook import handoff, session, training
rs = workbench.start(2, backend="gloo", threads=1, session="fsetup")
training.setup("ddp", rankset=rs)
lock = threading.Lock()

def holds_a_lock():  # refers to something only this process has
    with lock:
        training.setup("ddp")

training.start(5, max_failures=1, setup=holds_a_lock, rankset=rs)
training.wait(rankset=rs, timeout=120)
try:
    workbench.detach("fsetup")
except handoff.DetachError as exc:
    print("REFUSED " + json.dumps(str(exc)), flush=True)
sess = session.KERNEL.by_name["fsetup"]
print("KEPT " + json.dumps({{"running": sess.running, "setup": sess.setup.given is holds_a_lock,
                            "detached": sorted(handoff.detached_sets())}}), flush=True)

MARK = {mark!r}

def rebuild():  # a notebook's own function: no module to import it from
    with open(MARK, "a") as f:
        f.write("ran ")
    training.setup("ddp", model="tiny", lr=2e-3)

training.start(5, max_failures=1, setup=rebuild, rankset=rs)
training.wait(rankset=rs, timeout=120)
entry = workbench.detach("fsetup")
print("SET " + json.dumps({{"pids": sorted(rs.started_pids), "entry": entry}}), flush=True)
"""


def test_a_recovery_setup_function_travels_to_the_keeper_and_back_and_one_that_cannot_is_refused(tmp_path):
    """``train start --max-failures K`` with ``setup=`` a function: it goes with the set to the
    keeper and back (by value) and still rebuilds the trainer; a function that refers to
    something only the detaching process has is refused before anything changes."""
    from workbench.notebook import session

    mark = tmp_path / "setup-ran"
    proc = subprocess.run(
        [sys.executable, "-c", SETUP_FUNCTION.format(root=str(ROOT), mark=str(mark))],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    refused = json.loads(proc.stdout.split("REFUSED ", 1)[1].splitlines()[0])
    assert refused.startswith("the recovery setup holds_a_lock() cannot be carried to the keeper"), refused
    assert "pass the setup as code instead" in refused and "nothing was changed" in refused, refused
    assert _line(proc.stdout, "KEPT") == {"running": True, "setup": True, "detached": []}
    info = _line(proc.stdout, "SET")
    keeper = info["entry"]["keeper_pid"]
    held = [*info["pids"], keeper]
    sess = None
    try:
        sess = handoff.attach("fsetup")  # the function went to the keeper and comes back from it
        assert callable(sess.setup.given) and sess.setup.given.__name__ == "rebuild"
        assert not mark.exists()
        from workbench.notebook import training

        trained = training.status(rankset=sess.rankset)  # the trainers that took the runs' steps
        assert [s["state"] for s in trained] == ["finished"] * 2 and min(s["step"] for s in trained) > 0, trained
        sess.setup.given()  # what a recovery runs: it rebuilds the trainer on the ranks
        assert mark.read_text() == "ran "
        # a new trainer on every rank (idle at step 0 under a new run id), built as rebuild() says, and recorded here
        rebuilt = training.status(rankset=sess.rankset)
        assert [(s["state"], s["step"]) for s in rebuilt] == [("idle", 0)] * 2, rebuilt
        assert len({s["run"] for s in rebuilt}) == 1 and rebuilt[0]["run"] not in {s["run"] for s in trained}
        assert sess.setup.recipe == {"strategy": "ddp", "model": "tiny", "lr": 2e-3}
    finally:
        if sess is not None and sess.running:
            from workbench.notebook import api

            api.stop("fsetup")
        session.KERNEL.by_name.pop("fsetup", None)
        if "fsetup" in handoff.detached_sets():
            handoff.stop("fsetup")
        left = alive(held)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert left == [], f"processes left behind: {left}"
