"""What every benchmark shares: the machine it ran on, its rounds and targets saved as JSON
(``benchmarks/results/<bench>-<UTC time>.json``: ``bench``, ``args``, ``machine``, ``rounds``,
``summary``, ``targets`` of ``{name, value, op, limit, met}``, ``quick``), pooling of saved
runs, and an exit status that says whether the targets were met. ``--quick`` runs only check
that a script works: never quoted, their targets never fail the run."""

from __future__ import annotations

import dataclasses
import datetime
import glob
import json
import os
import pathlib
import platform
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
# the suite's --quick runs write elsewhere (WORKBENCH_BENCH_RESULTS), never among quoted runs
RESULTS = pathlib.Path(os.environ.get("WORKBENCH_BENCH_RESULTS") or HERE / "results")
OPS = {"<=": lambda v, lim: v <= lim, ">=": lambda v, lim: v >= lim}


def machine() -> dict:
    """Cores, load, memory and versions: what a reader needs to judge a figure."""
    info = {
        "cpu_count": os.cpu_count(),
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:  # pragma: no cover
        pass
    try:
        from importlib.metadata import version

        info["torch"] = version("torch")
    except Exception:  # pragma: no cover - torch missing
        info["torch"] = None
    try:
        info["commit"] = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, text=True, capture_output=True, timeout=5
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        info["commit"] = None
    return info


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
    name: str
    value: float
    op: str
    limit: float

    @property
    def met(self) -> bool:
        return OPS[self.op](self.value, self.limit)

    def line(self) -> str:
        return f"{'met ' if self.met else 'MISSED'} {self.name}: {self.value:.3f} (target {self.op} {self.limit})"


@dataclasses.dataclass
class Run:
    """One run of a benchmark: add rounds and targets, then :meth:`finish`."""

    bench: str
    args: dict
    quick: bool = False
    rounds: list = dataclasses.field(default_factory=list)
    summary: dict = dataclasses.field(default_factory=dict)
    targets: list = dataclasses.field(default_factory=list)
    started: str = dataclasses.field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    )
    machine_before: dict = dataclasses.field(default_factory=machine)

    def target(self, name: str, value: float, op: str, limit: float) -> Target:
        if op not in OPS:
            raise ValueError(f"target op {op!r}: use one of {sorted(OPS)}")
        t = Target(name=name, value=float(value), op=op, limit=float(limit))
        self.targets.append(t)
        return t

    def save(self, folder: pathlib.Path | str | None = None) -> pathlib.Path:
        folder = pathlib.Path(folder or RESULTS)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.bench}{'-quick' if self.quick else ''}-{self.started}.json"
        doc = {
            "bench": self.bench,
            "args": self.args,
            "quick": self.quick,
            "started": self.started,
            "machine": {**self.machine_before, "load_avg_after": [round(x, 2) for x in os.getloadavg()]},
            "rounds": self.rounds,
            "summary": self.summary,
            "targets": [{**dataclasses.asdict(t), "met": t.met} for t in self.targets],
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=float))
        tmp.replace(path)
        return path

    def finish(self, folder: pathlib.Path | str | None = None) -> int:
        """Save, print each target, and return the exit status (1 when a target was missed)."""
        path = self.save(folder)
        for t in self.targets:
            print(t.line())
        print(f"saved {path.relative_to(HERE.parent) if path.is_relative_to(HERE.parent) else path}")
        if self.quick:
            return 0
        return 0 if all(t.met for t in self.targets) else 1


def saved(bench: str, folder: pathlib.Path | str | None = None) -> list[dict]:
    """Every saved full (not ``--quick``) run of ``bench``, oldest first."""
    folder = pathlib.Path(folder or RESULTS)
    out = []
    for f in sorted(glob.glob(str(folder / f"{bench}-*.json"))):
        doc = json.loads(pathlib.Path(f).read_text())
        if doc.get("bench") == bench and not doc.get("quick"):
            doc["file"] = f
            out.append(doc)
    return out


def pool_report(bench: str, folder: pathlib.Path | str | None = None) -> int:
    """Print every saved run's targets side by side (``--pool``): every run counted."""
    runs = saved(bench, folder)
    if not runs:
        print(f"no saved runs of {bench} under {folder or RESULTS}", file=sys.stderr)
        return 2
    names = list(dict.fromkeys(t["name"] for r in runs for t in r["targets"]))
    print(f"{bench}: {len(runs)} saved runs")
    for name in names:
        vals = [(r["started"], t) for r in runs for t in r["targets"] if t["name"] == name]
        met = sum(t["met"] for _, t in vals)
        shown = ", ".join(f"{t['value']:.3f}" for _, t in vals)
        op, lim = vals[0][1]["op"], vals[0][1]["limit"]
        print(f"  {name} (target {op} {lim}): met in {met} of {len(vals)} runs: {shown}")
    return 0
