"""Tier 1: a tracker carried with a detached set (``trackers.carry`` / ``trackers.resume``).

The session's store and its open trackers travel pickled to the process that takes the set
(``notebook.handoff``); the tracker run goes on there, a real TensorBoard run here. A step some
rank had not reported yet when it left is written once, with every rank, where it arrives.
"""

import glob
import os
import pickle

from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto import event_pb2

from workbench.notebook import trackers
from workbench.notebook.session import Session
from workbench.notebook.stream.store import EventStore
from workbench.notebook.trackers.backends import TensorBoard
from workbench.shared import events


class _TwoRanks:  # what a tracker reads of a rank set: its size (not running: the store is the session's)
    world_size, running, config = 2, False, None


def _step(step, rank):
    return events.step_event(run="r", rank=rank, step=step, metrics={"loss": 10.0 * rank + step})


def _session(store):
    sess = Session("night", _TwoRanks())
    sess.stream.store = store
    return sess


def _scalars(logdir):
    """{tag: [(writer's pid, step, value)]} over every event file of the run folder."""
    out = {}
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        pid = int(os.path.basename(path).split(".")[-2])
        for raw in RawEventFileLoader(path).Load():
            event = event_pb2.Event.FromString(raw)
            for v in event.summary.value:
                if v.WhichOneof("value") == "simple_value":
                    out.setdefault(v.tag, []).append((pid, event.step, v.simple_value))
    return out


def test_a_carried_tracker_writes_on_into_the_same_run_each_step_once_with_the_waiting_one(tmp_path):
    store = EventStore(1000)
    sess = _session(store)
    sess.trackers.by_kind["tensorboard"] = trackers.Tracker(TensorBoard(), sess, str(tmp_path))
    store.add([_step(s, r) for s in range(1, 6) for r in (0, 1)] + [_step(6, 0)])  # rank 1's step 6: later
    assert sess.trackers.by_kind["tensorboard"].flush()

    carried = trackers.carry(sess)
    assert sess.trackers.by_kind == {} and len(carried) == 1
    (c,) = carried
    assert [key for key, _ in c["waiting"]] == [("r", 6)] and c["steps_written"] == 5
    moved_store, moved = pickle.loads(pickle.dumps((store, carried)))  # as the keeper gets them

    there = _session(moved_store)
    assert trackers.resume(there, moved) == []
    tracker = there.trackers.by_kind["tensorboard"]
    assert tracker.run_name == c["run_name"]
    moved_store.add([_step(6, 1)] + [_step(s, r) for s in range(7, 11) for r in (0, 1)])
    tracker.close()
    ended = tracker.info()
    assert ended["steps"] == 10 and ended["errors"] == []

    (run_dir,) = glob.glob(os.path.join(str(tmp_path), "night-*"))
    got = _scalars(run_dir)
    for rank in (0, 1):
        series = got[f"r/loss/rank{rank}"]
        assert sorted(s for _, s, _ in series) == list(range(1, 11))
        assert sorted((s, v) for _, s, v in series) == [(s, 10.0 * rank + s) for s in range(1, 11)]
    mean = dict((s, v) for _, s, v in got["r/loss/mean"])
    assert len(got["r/loss/mean"]) == 10 and mean[6] == 11.0  # step 6 with both ranks, written once


def test_a_tracker_that_cannot_open_where_it_arrives_is_named_with_what_to_do(tmp_path):
    store = EventStore(1000)
    sess = _session(store)
    sess.trackers.by_kind["tensorboard"] = trackers.Tracker(TensorBoard(), sess, str(tmp_path / "tb"))
    (c,) = trackers.carry(sess)
    c["backend"]["logdir"] = str(tmp_path / "a-file")
    (tmp_path / "a-file").write_text("")  # not a folder: the writer cannot open there
    there = _session(store)
    (note,) = trackers.resume(there, [c])
    assert note.startswith(
        f"the tensorboard tracker (run {c['run_name']} in {tmp_path / 'tb'}) could not be opened again"
    )
    assert note.endswith(f"`%distrain track start tensorboard --dir {tmp_path / 'tb'}` starts a new run")
    assert there.trackers.by_kind == {}
