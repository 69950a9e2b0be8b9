"""The four trackers, each behind the same small interface, all local and offline.

The interface is :class:`Backend`: ``carry()`` ends this process's hold on the run without
ending it, returning plain data from which ``resume(carried)`` in another process (a detached
set's keeper, the kernel that attaches) writes on into the same run. Each imports its package
only when opened (MLflow and W&B take seconds to import), and never anything of torch:
TensorBoard's event files are written with the ``tensorboard`` package's own writer and protos,
not ``torch.utils.tensorboard``.
"""

from __future__ import annotations

import os
from typing import Protocol

from ...shared.errors import WorkbenchError


class TrackerError(WorkbenchError):
    """A tracker that cannot be used as asked; nothing was started."""


class Backend(Protocol):
    """``open(run_name, directory, params)`` (the run name is ``<session>-<time>``), ``artifact``
    where ``has_artifacts``, ``where()`` what to open to read the run."""

    name: str
    package: str  # the module imported, and the pyproject extra that installs it
    has_artifacts: bool

    def open(self, run_name: str, directory: str, params: dict) -> None: ...
    def params(self, params: dict) -> None: ...
    def log(self, run: str, step: int, values: dict[str, float], wall: float) -> None: ...
    def artifact(self, folder: str) -> None: ...
    def flush(self) -> None: ...  # the mirror has nothing more queued (or a second passed): write what is due
    def where(self) -> str: ...
    def close(self) -> None: ...
    def carry(self) -> dict: ...
    def resume(self, carried: dict) -> None: ...


class TensorBoard:
    """Event files under ``<dir>/<run name>``: a scalar per series, the parameters as a text
    summary (``parameters``, a Markdown table) each time some are added."""

    name = package = "tensorboard"
    has_artifacts = False

    def open(self, run_name: str, directory: str, params: dict) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.logdir = os.path.join(directory, run_name)
        self.writer = EventFileWriter(self.logdir)
        self.known: dict = {}
        self.params(params)

    def params(self, params: dict) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2

        self.known.update(params)
        table = "| parameter | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in self.known.items())
        meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
        tensor = tensor_pb2.TensorProto(dtype="DT_STRING", string_val=[table.encode()])
        value = summary_pb2.Summary.Value(tag="parameters", metadata=meta, tensor=tensor)
        self.writer.add_event(event_pb2.Event(summary=summary_pb2.Summary(value=[value]), step=len(self.known)))

    def log(self, run: str, step: int, values: dict[str, float], wall: float) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in values.items()]
        )
        self.writer.add_event(event_pb2.Event(summary=summary, step=step, wall_time=wall))

    def artifact(self, folder: str) -> None:
        pass

    def flush(self) -> None:
        self.writer.flush()

    def where(self) -> str:
        return f"tensorboard --logdir {self.logdir}"

    def close(self) -> None:
        self.writer.close()

    def carry(self) -> dict:
        self.writer.close()
        return {"logdir": self.logdir, "known": dict(self.known)}

    def resume(self, carried: dict) -> None:
        """A new event file in the same run folder (its name holds this pid): TensorBoard reads
        the folder's files as one run."""
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.logdir, self.known = carried["logdir"], dict(carried["known"])
        self.writer = EventFileWriter(self.logdir)


class MLflow:
    """A run of experiment ``workbench`` in an SQLite store ``<dir>/mlflow.db`` (MLflow's
    file store is retired), artifacts under ``<dir>/artifacts``; parameters as MLflow params,
    checkpoints as artifacts ``checkpoints/<folder>`` (copied)."""

    name = package = "mlflow"
    has_artifacts = True
    EXPERIMENT = "workbench"
    BATCH = 1000
    WAIT_S = 2.0  # the most a value waits in the buffer while the mirror is busy or idle

    def open(self, run_name: str, directory: str, params: dict) -> None:
        from mlflow.tracking import MlflowClient

        os.makedirs(directory, exist_ok=True)
        self.uri = f"sqlite:///{os.path.abspath(directory)}/mlflow.db"
        self.client = MlflowClient(tracking_uri=self.uri)
        found = self.client.get_experiment_by_name(self.EXPERIMENT)
        experiment = (
            found.experiment_id
            if found is not None
            else self.client.create_experiment(
                self.EXPERIMENT, artifact_location=os.path.join(os.path.abspath(directory), "artifacts")
            )
        )
        self.run_id = self.client.create_run(experiment, run_name=run_name).info.run_id
        self.buffer: list = []
        self.written = 0.0
        self.params(params)

    def params(self, params: dict) -> None:
        from mlflow.entities import Param

        self.client.log_batch(self.run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])

    def log(self, run: str, step: int, values: dict[str, float], wall: float) -> None:
        from mlflow.entities import Metric

        ms = int(wall * 1000)
        self.buffer.extend(Metric(k, v, ms, step) for k, v in values.items())
        if len(self.buffer) >= self.BATCH:
            self.flush()  # full batches as they fill

    def flush(self, final: bool = False) -> None:
        """Write the buffered values in transactions of up to 1000 (MLflow's limit per batch),
        when 1000 are waiting, ``WAIT_S`` after the last write, or at the end: a transaction costs
        MLflow's SQLite store as much whatever its size (docs/trackers.md, "What it costs"), so
        one per step (or per batch from the ranks) would fall behind a run."""
        import time

        if not (final or len(self.buffer) >= self.BATCH or time.monotonic() - self.written >= self.WAIT_S):
            return
        while self.buffer:
            self.client.log_batch(self.run_id, metrics=self.buffer[: self.BATCH])
            del self.buffer[: self.BATCH]
        self.written = time.monotonic()

    def artifact(self, folder: str) -> None:
        self.client.log_artifacts(self.run_id, folder, artifact_path=f"checkpoints/{os.path.basename(folder)}")

    def where(self) -> str:
        return f"mlflow ui --backend-store-uri {self.uri}  (run {self.run_id})"

    def close(self) -> None:
        self.flush(final=True)
        self.client.set_terminated(self.run_id)

    def carry(self) -> dict:
        self.flush(final=True)  # the run stays RUNNING: the next process logs into it
        return {"uri": self.uri, "run_id": self.run_id}

    def resume(self, carried: dict) -> None:
        from mlflow.tracking import MlflowClient

        self.uri, self.run_id = carried["uri"], carried["run_id"]
        self.client = MlflowClient(tracking_uri=self.uri)
        self.buffer = []
        self.written = 0.0


class WandB:
    """An offline W&B run (``mode="offline"``: no account, nothing sent) under ``<dir>/wandb``;
    ``wandb sync`` uploads it later if wanted. Each workbench run's series are plotted
    against its own ``<run>/step``; checkpoints are artifacts by reference (not copied)."""

    name = package = "wandb"
    has_artifacts = True

    def open(self, run_name: str, directory: str, params: dict) -> None:
        os.makedirs(directory, exist_ok=True)
        self.run = self._init(directory, run_name, config=params)
        self.steps: set[str] = set()

    def _init(self, directory: str, run_name: str, **more):
        import wandb

        self.directory = directory
        return wandb.init(
            mode="offline",
            dir=directory,
            project="workbench",
            name=run_name,
            reinit="create_new",  # several sessions, several runs, side by side
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True, save_code=False),
            **more,
        )

    def params(self, params: dict) -> None:
        self.run.config.update(params, allow_val_change=True)

    def log(self, run: str, step: int, values: dict[str, float], wall: float) -> None:
        if run not in self.steps:
            self.steps.add(run)
            self.run.define_metric(f"{run}/step")
            self.run.define_metric(f"{run}/*", step_metric=f"{run}/step")
        self.run.log({f"{run}/step": step, **values})

    def artifact(self, folder: str) -> None:
        import wandb

        art = wandb.Artifact(f"checkpoint-{os.path.basename(folder)}", type="checkpoint")
        art.add_reference(f"file://{os.path.abspath(folder)}", checksum=False)
        self.run.log_artifact(art)

    def flush(self) -> None:
        pass  # W&B's own service writes as it goes

    def where(self) -> str:
        return f"{self.run.dir}  (wandb sync {os.path.dirname(self.run.dir)})"

    def close(self) -> None:
        self.run.finish()

    def carry(self) -> dict:
        """Resumed by id: each process writes an offline-run folder of the same id, and
        ``wandb sync`` of each uploads into the one run."""
        carried = {"id": self.run.id, "dir": self.directory, "name": self.run.name}
        self.run.finish()
        return carried

    def resume(self, carried: dict) -> None:
        self.run = self._init(carried["dir"], carried["name"], id=carried["id"], resume="allow")
        self.steps = set()  # each run's step metric is defined again in this process's part


class Trackio:
    """A trackio run in its local store (SQLite, ``TRACKIO_DIR``): project ``workbench``, the
    run named after the session, the parameters as its config. trackio reads ``TRACKIO_DIR``
    once, when first imported, so one folder per kernel."""

    name = package = "trackio"
    has_artifacts = False
    PROJECT = "workbench"

    def open(self, run_name: str, directory: str, params: dict) -> None:
        self.run = self._init(directory, run_name, config=params)

    def _init(self, directory: str, run_name: str, **more):
        import sys

        directory = os.path.abspath(directory)
        if "trackio" in sys.modules:
            from trackio import utils

            if os.path.abspath(str(utils.TRACKIO_DIR)) != directory:
                raise TrackerError(
                    f"trackio in this kernel already writes to {utils.TRACKIO_DIR} (it reads its folder once, "
                    f"when first imported): give --dir {utils.TRACKIO_DIR}, or restart the kernel for {directory}"
                )
        os.environ["TRACKIO_DIR"] = directory
        import trackio

        self.directory = directory
        return trackio.init(
            project=self.PROJECT, name=run_name, embed=False, auto_log_cpu=False, auto_log_gpu=False, **more
        )

    def params(self, params: dict) -> None:
        self.run.config.update(params)  # kept by trackio with the run's records

    def log(self, run: str, step: int, values: dict[str, float], wall: float) -> None:
        self.run.log(values, step=step)

    def artifact(self, folder: str) -> None:
        pass

    def flush(self) -> None:
        pass  # trackio's own thread writes as it goes

    def where(self) -> str:
        return f"TRACKIO_DIR={self.directory} trackio show --project {self.PROJECT}"

    def close(self) -> None:
        self.run.finish()

    def carry(self) -> dict:
        carried = {"dir": self.directory, "name": self.run.name}
        self.run.finish()
        return carried

    def resume(self, carried: dict) -> None:
        self.run = self._init(carried["dir"], carried["name"], resume="must")


BACKENDS: dict[str, type] = {b.name: b for b in (TensorBoard, MLflow, WandB, Trackio)}
