"""Code that travels: the notebook's folder on two other hosts, its first sync and each edit's cost.

Targets (the method: docs/figures.md; docs/clusters.md): over 2 hosts (network namespaces
with sshd, the notebook's folder hidden there) and a folder of 200 files, 20 MiB, the first sync
<= 2 s; a one-file edit adds <= 0.3 s to the next cell against the same cell with no edit,
and an unchanged folder <= 20 ms against the same cell with no sync at all, at each rank
count; for ranks on the notebook's host the sync costs a cell at most a microsecond (one attribute read). Needs root.
Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sync_bench.py --ranks 4,16,64``
(``--quick``: 4 ranks, few rounds, checks the script only). Results:
``benchmarks/results/sync-*.json``; exit status 1 when a target is missed."""

from __future__ import annotations

import argparse
import io
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import redirect_stdout

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
os.environ.setdefault("IPYTHONDIR", str(ROOT / ".state" / "bench" / "ipython"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))
import results  # noqa: E402

PROFILE = ROOT / ".state" / "bench" / "sync-profile"
FILES, DATA_FILES = 200, 10
TOTAL = 20 * 2**20


def make_folder() -> pathlib.Path:
    """200 files, 20 MiB in all: 190 modules of 10 kB in a few packages, 10 data files."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="wb-bench-notebook-"))
    small = FILES - DATA_FILES
    body = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(400))[: 10 * 1024]
    for i in range(small):
        pkg = folder / f"pkg{i % 8}"
        pkg.mkdir(exist_ok=True)
        (pkg / f"mod{i}.py").write_text(f"# module {i}\n" + body)
    per = (TOTAL - small * 10 * 1024) // DATA_FILES
    (folder / "data").mkdir()
    for i in range(DATA_FILES):
        (folder / "data" / f"shard{i}.bin").write_bytes(os.urandom(per))
    (folder / "edited.py").write_text("VALUE = 0\n")
    return folder


def ssh_config(hosts, path: pathlib.Path) -> pathlib.Path:
    """One ssh_config that reaches both hosts (each has its own port and key)."""
    lines = []
    for h in hosts:
        lines += [f"Host {h.addr}", *(f"  {x}" for x in h.ssh_config.read_text().splitlines()[1:] if x.strip())]
    path.write_text("\n".join(lines) + "\n")
    return path


def wipe_caches(hosts) -> None:
    """Empty both hosts' caches (an ssh refused while sshd is busy is tried again)."""
    for h in hosts:
        for _ in range(10):
            if h.ssh("rm -rf ~/.cache/workbench && test ! -e ~/.cache/workbench").returncode == 0:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"could not empty the cache of {h.hostname}")


def first_syncs(rs, hosts, rounds: int) -> tuple[list[float], list[int]]:
    """A first sync of the folder to both hosts, caches emptied before each: the start's own
    code path (walk with nothing hashed yet, contents sent, copies made, ranks entered)."""
    from workbench.notebook.cluster import code_sync

    out, sent = [], []
    for _ in range(rounds):
        wipe_caches(hosts)
        cs = code_sync.CodeSync(rs.config.sync, [])
        t0 = time.perf_counter()
        report = cs.begin(rs)
        out.append(time.perf_counter() - t0)
        sent.append(report.sent_bytes)
        assert report.sent_bytes >= 2 * TOTAL * 0.95, report.sent_bytes  # every file to both hosts
        rs.code_sync = cs
    return out, sent


def cells(rs, folder: pathlib.Path, rounds: int) -> dict:
    """The same trivial cell, interleaved: with no sync at all, with an unchanged folder, and
    after a one-file edit of a module the ranks imported (its reload included)."""
    from workbench.notebook import api, session

    cs = rs.code_sync
    times: dict[str, list[float]] = {"plain": [], "unchanged": [], "edit": []}
    with session.using(rs):
        api.run("import edited", display=False, timeout=120)
        for i in range(rounds + 1):
            for kind in times:
                if kind == "edit":
                    (folder / "edited.py").write_text(f"VALUE = {i + 1}\n")
                rs.code_sync = None if kind == "plain" else cs
                t0 = time.perf_counter()
                api.run("x = edited.VALUE", display=False, timeout=120)
                if i:  # the first round warms each path
                    times[kind].append(time.perf_counter() - t0)
        rs.code_sync = cs
        assert rs.pull("x") == [rounds + 1] * rs.world_size
    return {k: statistics.median(v) for k, v in times.items()} | {"samples": times}


def local_cost(rounds: int) -> dict:
    """Ranks on this host: what ``workbench.run`` does for the sync before a cell (one attribute
    read: the set has no sync part), timed by itself; and a trivial cell through ``workbench.run``
    beside ``run_cell`` (no hook, and none of ``workbench.run``'s other steps), interleaved."""
    import timeit

    from workbench.notebook import api, session
    from workbench.notebook.cluster import RankSet
    from workbench.notebook.cluster.cell import run_cell

    rs = RankSet.start(n=2, backend="gloo", threads=1, profile_dir=str(PROFILE / "local"))
    try:
        hook, direct = [], []
        with session.using(rs):
            for i in range(rounds + 1):
                t0 = time.perf_counter()
                api.run("x = 1", display=False)
                t1 = time.perf_counter()
                run_cell(rs, "x = 1", display=False)
                t2 = time.perf_counter()
                if i:
                    hook.append(t1 - t0)
                    direct.append(t2 - t1)
        check = timeit.Timer('getattr(rs, "code_sync", None) is not None', globals={"rs": rs})
        calls, total = check.autorange()
        return {
            "hook_s": total / calls,
            "api_run_s": statistics.median(hook),
            "run_cell_s": statistics.median(direct),
            "synced": rs.code_sync,
        }
    finally:
        rs.stop()


def run_size(n: int, hosts, config: pathlib.Path, folder: pathlib.Path, rounds: int, first_rounds: int) -> dict:
    from workbench.notebook.cluster import RankSet

    wipe_caches(hosts)
    here = os.getcwd()
    os.chdir(folder)
    t0 = time.perf_counter()
    try:
        with redirect_stdout(io.StringIO()):
            rs = RankSet.start(
                n=n,
                backend="gloo",
                threads=1,
                launcher="ssh",
                hosts=",".join(f"root@{h.addr}:{n // len(hosts)}" for h in hosts),
                ssh_config=str(config),
                profile_dir=str(PROFILE / str(n)),
                progress=lambda line: None,
            )
    finally:
        os.chdir(here)
    start_s = time.perf_counter() - t0
    try:
        first = rs.code_sync.first
        got = {
            "ranks": n,
            "start_s": start_s,
            "start_first_sync_s": first.seconds,
            "files": len(rs.code_sync.folders[0].listing.entries),
            "bytes": rs.code_sync.folders[0].listing.size,
        }
        os.chdir(folder)  # the notebook's working folder: the one synced
        try:
            got["first_sync_s"], got["first_sync_bytes"] = first_syncs(rs, hosts, first_rounds)
        finally:
            os.chdir(here)
        got |= cells(rs, folder, rounds)
        return got
    finally:
        rs.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="4,16,64", help="total ranks over the 2 hosts, comma-separated")
    p.add_argument("--rounds", type=int, default=15, help="cells of each kind per size")
    p.add_argument("--first-rounds", type=int, default=5, help="first syncs per size")
    p.add_argument("--quick", action="store_true", help="4 ranks, 3 rounds: checks the script only")
    args = p.parse_args()
    sizes = [4] if args.quick else [int(x) for x in args.ranks.split(",")]
    rounds, first_rounds = (3, 1) if args.quick else (args.rounds, args.first_rounds)
    run = results.Run("sync", vars(args), quick=args.quick)

    from cluster.daemons import Bridge, SecondHost

    folder = make_folder()
    hosts, bridge = [], None
    try:
        bridge = Bridge(net=233)  # both hosts on one /24: they reach each other and the notebook
        hosts = [SecondHost(name=n, hide=[folder], bridge=bridge) for n in ("hostb", "hostc")]
        config = ssh_config(hosts, pathlib.Path(hosts[0].dir) / "both_config")
        local = local_cost(rounds * 3)
        run.summary["local"] = {k: v for k, v in local.items() if k != "synced"}
        assert local["synced"] is None  # ranks on this host: no sync part at all
        for n in sizes:
            got = run_size(n, hosts, config, folder, rounds, first_rounds)
            run.rounds.append(got)
            first = statistics.median(got["first_sync_s"])
            print(
                f"{n} ranks: first sync {first:.2f} s ({got['files']} files, {got['bytes'] / 2**20:.1f} MiB); cell "
                f"{got['plain'] * 1e3:.1f} ms, unchanged +{(got['unchanged'] - got['plain']) * 1e3:.1f} ms, "
                f"one-file edit +{(got['edit'] - got['unchanged']) * 1e3:.1f} ms"
            )
            run.target(f"first sync of the folder to 2 hosts, {n} ranks (s)", first, "<=", 2.0)
            run.target(f"a one-file edit's added time, {n} ranks (s)", got["edit"] - got["unchanged"], "<=", 0.3)
            run.target(f"an unchanged folder's added time, {n} ranks (s)", got["unchanged"] - got["plain"], "<=", 0.02)
        run.target("ranks on this host: the sync's cost before a cell (s)", local["hook_s"], "<=", 1e-6)
    finally:
        for h in hosts:
            h.close()
        if bridge is not None:
            bridge.close()
        shutil.rmtree(folder, ignore_errors=True)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
