"""Every flag of every ``%distrain`` sub-command either changes behaviour or is refused.

The parsers are introspected (:func:`every_flag`), so a flag added later without a case in
:data:`CASES` fails ``test_every_flag_has_a_case``. A case is either a refusal (the line is
run through a real IPython shell and must fail naming the flag, with the ranks unchanged)
or the name of a scenario test below that drives the flag through the shell on real ranks
(the shared ``ranks2``; ``fresh_ranks`` where ranks are started or restarted) and asserts
its effect.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time

import pytest

from workbench.notebook import api
from workbench.notebook.commands import COMMANDS, UsageError, load_all

load_all()


def every_flag() -> set[tuple[str, str]]:
    """(words that reach the parser, longest spelling of the flag) for every parser (``plan``'s
    holds the planner's flags)."""
    from workbench.notebook import magics

    parsers = {words: p for cmd in COMMANDS.values() for words, p in cmd.parsers().items()}
    parsers["%%distrain"] = magics.CELL
    out = set()
    for words, p in parsers.items():
        for action in p._actions:
            if action.option_strings and action.dest != "help":
                out.add((words, max(action.option_strings, key=len)))
    return out


def refused(line: str, fragment: str):
    return ("refused", line, fragment)


# Scenario names are test functions of this module; each asserts the effect of its flags.
TRAIN, CKPT, LIFE, CELL, PLAN, VIEWS, PREP = (
    "test_train_flags",
    "test_ckpt_flags",
    "test_start_restart_load_flags",
    "test_cell_flags",
    "test_plan_flags",
    "test_view_flags",
    "test_prepare_and_layout_flags",
)
OUTPUT = "test_output_and_logs_flags"
NAMED = "test_named_set_flags"  # two named sets side by side: tests/ranks/test_sessions.py
TRACK = "test_track_flags"
SLURM_ONLY = "go with --launcher slurm"  # their effect on a real Slurm: tests/cluster/test_slurm.py

NOPE = "there is no rank set named 'nope'"
# `--session NAME` of a command that does not read it itself makes NAME current for the line (one
# path in the dispatcher): its effect is driven in NAMED for status/push/pull/where/logs/train
# status/ckpt wait/restart; for the others a name that is not there is refused before anything runs.
SESSION_REFUSED = {
    "prepare": "prepare ddp --session nope",
    "layout": "layout --session nope",
    "train start": "train start --steps 1 --session nope",
    "train pause": "train pause --session nope",
    "train resume": "train resume --session nope",
    "train stop": "train stop --session nope",
    "train set": "train set lr=0.1 --session nope",
    "train wait": "train wait --session nope",
    "ckpt save": "ckpt save --session nope",
    "ckpt load": "ckpt load --session nope",
    "ckpt autosave": "ckpt autosave --every 2 --session nope",
    "track start": "track start tensorboard --session nope",
    "track stop": "track stop --session nope",
    "timeline": "timeline --session nope",
    "pipeline": "pipeline --session nope",
    "profile": "profile --session nope",
    "debug": "debug --ranks 0 --session nope",
    # their effect: tests/ranks/test_sessions.py (use), tests/ranks/test_detach.py (detach, attach)
    "use": "use --session nope",
    "detach": "detach --session nope",
    # its effect (edits reach a host that cannot read the notebook's folder): tests/cluster/test_code_sync.py
    "sync": "sync --session nope",
}

CASES: dict[tuple[str, str], object] = {
    # ranks' life cycle
    ("start", "-n"): LIFE,
    ("start", "--backend"): LIFE,
    ("start", "--collective-timeout"): LIFE,
    ("start", "--threads"): LIFE,
    ("start", "--auto"): LIFE,
    ("start", "--session"): NAMED,
    ("stop", "--session"): NAMED,
    ("status", "--session"): NAMED,
    ("push", "--session"): NAMED,
    ("pull", "--session"): NAMED,
    ("where", "--session"): NAMED,
    ("logs", "--session"): NAMED,
    ("train status", "--session"): NAMED,
    ("ckpt wait", "--session"): NAMED,
    ("restart", "--session"): NAMED,
    ("dashboard", "--session"): NAMED,
    ("%%distrain", "--session"): NAMED,
    ("attach", "--session"): refused("attach --session nope", "there is no detached rank set named 'nope'"),
    **{(words, "--session"): refused(line, NOPE) for words, line in SESSION_REFUSED.items()},
    ("start", "--ip"): refused("start --ip 127.0.0.1", "--ip goes with --launcher ssh, slurm or ray"),
    ("start", "--launcher"): refused("start -n 2 --launcher ssh", "--launcher ssh needs --hosts"),
    # its effect on real JAX ranks: tests/ranks/test_jax_ranks.py
    ("start", "--framework"): refused("start -n 2 --framework jax --backend nccl", "--backend nccl is torch's"),
    ("start", "--hosts"): refused("start --hosts a:1,b:1", "--hosts goes with --launcher ssh"),
    ("start", "--ssh-config"): refused("start --ssh-config /nonexistent", "--ssh-config and --python go with"),
    ("start", "--python"): refused("start --python /usr/bin/python3", "--ssh-config and --python go with"),
    ("start", "--nodes"): refused("start --nodes 2", SLURM_ONLY),
    ("start", "--gpus-per-node"): refused("start --gpus-per-node 1", SLURM_ONLY),
    ("start", "--partition"): refused("start --partition debug", SLURM_ONLY),
    ("start", "--time"): refused("start --time 0:10:00", SLURM_ONLY),
    ("start", "--account"): refused("start --account me", SLURM_ONLY),
    ("start", "--sbatch"): refused("start --sbatch=--constraint=x", SLURM_ONLY),
    # their effect on started ranks (env and status): tests/ranks/test_fp8_nccl_ranks.py
    ("start", "--nccl"): refused("start --nccl BOGUS=1", "unknown setting 'BOGUS'"),
    ("start", "--nccl-preset"): refused("start --nccl-preset nope", "is not one of ib, roce, nvl72"),
    # their effect on a real two-node Ray cluster: tests/cluster/test_ray.py
    ("start", "--address"): refused("start --address 127.0.0.1:6379", "--address go with --launcher ray"),
    ("start", "--cpus-per-rank"): refused("start --cpus-per-rank 2", "--cpus-per-rank go with --launcher ray"),
    ("start", "--gpus-per-rank"): refused("start --gpus-per-rank 1", "--gpus-per-rank go with --launcher ray"),
    # their effect on a host that cannot read the notebook's folder: tests/cluster/test_code_sync.py
    ("start", "--sync"): refused("start --sync .", "--sync, --sync-limit and --no-sync go with --launcher ssh"),
    ("start", "--sync-limit"): refused("start --sync-limit 5Q", "a size is a number with an optional unit"),
    ("start", "--no-sync"): refused("start --no-sync", "--sync, --sync-limit and --no-sync go with --launcher ssh"),
    ("restart", "-n"): LIFE,
    ("restart", "--backend"): LIFE,
    ("restart", "--collective-timeout"): LIFE,
    ("restart", "--load"): LIFE,
    ("restart", "--setup"): LIFE,
    ("restart", "--dir"): LIFE,
    ("push", "--ranks"): VIEWS,
    ("pull", "--ranks"): VIEWS,
    ("where", "--ranks"): VIEWS,
    ("where", "--full"): VIEWS,
    ("where", "--timeout"): VIEWS,
    ("where", "--grouped"): VIEWS,
    ("where", "--per-rank"): VIEWS,
    ("logs", "--ranks"): OUTPUT,
    ("logs", "--tail"): OUTPUT,
    ("logs", "--grep"): OUTPUT,
    ("logs", "--grouped"): OUTPUT,
    ("logs", "--per-rank"): OUTPUT,
    # its effect (pdb on the rank named): tests/notebooks/test_cells_kernel.py
    ("debug", "--ranks"): refused("debug --ranks 7", "--ranks 7: rank(s) 7 do not exist"),
    # training
    ("train start", "--steps"): TRAIN,
    ("train start", "--gpt"): TRAIN,
    ("train start", "--strategy"): TRAIN,
    ("train start", "--batch-size"): TRAIN,
    ("train start", "--lr"): TRAIN,
    ("train start", "--grad-accum"): TRAIN,
    ("train start", "--step-timeout"): TRAIN,
    ("train start", "--no-dashboard"): TRAIN,
    # their effect (a run recovered by itself, a budget spent): tests/ranks/test_recovery.py
    ("train start", "--max-failures"): refused("train start --max-failures 0", "argument --max-failures"),
    ("train start", "--setup"): refused("train start --setup code", "--setup names the code a recovery repeats"),
    # their effect (survivors keep stepping, a lost replica healed from a peer): tests/ranks/test_fault_tolerant.py
    ("train start", "--fault-tolerant"): refused(
        "train start --fault-tolerant --strategy fsdp2", "--fault-tolerant runs a replicated layout"
    ),
    ("train start", "--replicas"): refused("train start --replicas 2", "--replicas goes with --fault-tolerant"),
    ("train start", "--quorum-timeout"): refused(
        "train start --quorum-timeout 5", "--quorum-timeout goes with --fault-tolerant"
    ),
    ("train wait", "--timeout"): TRAIN,
    ("dashboard", "--export"): TRAIN,
    ("dashboard", "--run"): TRAIN,
    ("timeline", "--steps"): TRAIN,
    ("timeline", "--ranks"): TRAIN,
    ("timeline", "--run"): TRAIN,
    ("timeline", "--table"): TRAIN,
    ("profile", "--steps"): TRAIN,
    ("profile", "--ranks"): TRAIN,
    ("profile", "--dir"): TRAIN,
    ("profile", "--timeout"): TRAIN,
    ("profile", "--code"): TRAIN,
    # checkpoints
    ("ckpt save", "--dir"): CKPT,
    ("ckpt save", "--tag"): CKPT,
    ("ckpt save", "--async"): CKPT,
    ("ckpt save", "--model-only"): CKPT,
    ("ckpt list", "--dir"): CKPT,
    ("ckpt load", "--dir"): CKPT,
    ("ckpt load", "--model-only"): CKPT,
    ("ckpt verify", "--dir"): CKPT,
    ("ckpt delete", "--dir"): CKPT,
    ("ckpt delete", "--keep"): CKPT,
    ("ckpt export", "--dir"): CKPT,
    ("ckpt export", "--dtype"): CKPT,
    ("ckpt export", "--hf"): CKPT,
    ("ckpt export", "--merged"): CKPT,
    ("ckpt autosave", "--dir"): CKPT,
    ("ckpt autosave", "--every"): CKPT,
    ("ckpt autosave", "--keep"): CKPT,
    ("ckpt autosave", "--async"): CKPT,
    ("ckpt autosave", "--off"): CKPT,
    # layouts
    ("prepare", "--blocks"): PREP,
    ("prepare", "--model-var"): PREP,
    ("prepare", "--optimizer-var"): PREP,
    ("layout", "--tensor"): PREP,
    ("layout", "--match"): PREP,
    ("layout", "--max"): PREP,
    # the cell magic
    ("%%distrain", "--ranks"): CELL,
    ("%%distrain", "--timeout"): CELL,
    ("%%distrain", "--grace"): CELL,
    ("%%distrain", "--fail-fast"): CELL,
    ("%%distrain", "--stream"): CELL,
    ("%%distrain", "--no-stream"): CELL,
    ("%%distrain", "--grouped"): VIEWS,
    ("%%distrain", "--per-rank"): VIEWS,
    ("%%distrain", "--output"): OUTPUT,
    # experiment trackers
    ("track start", "--dir"): TRACK,
    ("track start", "--metrics"): TRACK,
    # its effect (the planner beside one measured step on the ranks): tests/ranks/test_prepare_command.py
    ("plan", "--live"): refused("plan --live --tp 2", "--live plans the model on the ranks"),
    # their effect (positions, collectives and the planner beside them): tests/ranks/test_dry_run.py
    ("plan", "--dry-run"): refused("plan --dry-run --live", "--live plans the ranks' model, --dry-run a layout"),
    ("plan", "--build"): refused("plan --build make_model", "--build VAR names the model a dry run lays out"),
}
PLAN_BASE = "--model 8b --hw h100"
# plan flag -> (words with it, words without it), each after PLAN_BASE: the two printed plans must differ
PLAN_CASES = {
    "--model": ("--model 70b", ""),
    "--hardware": ("--hardware a100-sxm", ""),
    "--gpus": ("--gpus 128", ""),
    "--tp": ("--tp 2", ""),
    "--pp": ("--pp 2", ""),
    "--dp": ("--tp 2 --dp 4", "--tp 2"),
    "--dp-replicate": ("--zero 3 --dp-shard 4 --dp-replicate 2", "--zero 3 --dp-shard 4"),
    "--dp-shard": ("--dp-replicate 2 --zero 3 --dp-shard 4", "--dp-replicate 2"),
    "--zero": ("--zero 1", ""),
    "--fsdp": ("--fsdp", ""),
    "--cp": ("--cp 2", ""),
    "--ep": ("--model mixtral-8x7b --dp 4 --ep 2", "--model mixtral-8x7b --dp 4"),
    "--microbatches": ("--pp 2 --microbatches 8", "--pp 2"),
    "--mbs": ("--mbs 2", ""),
    "--schedule": ("--pp 2 --schedule gpipe", "--pp 2"),
    "--virtual-stages": ("--pp 2 --schedule interleaved --virtual-stages 4", "--pp 2 --schedule interleaved"),
    "--precision": ("--precision fp32", ""),
    "--fp8": ("--fp8", ""),
    "--attention": ("--attention eager", ""),
    "--layers-per-stage": ("--pp 2 --layers-per-stage 12,20", "--pp 2"),
    "--recompute": ("--recompute full", ""),
    "--offload": ("--zero 3 --offload", "--zero 3"),
    "--no-sp": ("--tp 2 --no-sp", "--tp 2"),
    "--seq-len": ("--seq-len 2048", ""),
    "--tokens": ("--tokens 1e12", ""),
    "--price": ("--tokens 1e12 --price 2.5", "--tokens 1e12"),
    "--lora": ("--lora 16", ""),
    "--nvme": ("--zero 3 --nvme 5", "--zero 3"),
}
for _flag in PLAN_CASES:
    CASES[("plan", _flag)] = PLAN


def test_every_flag_has_a_case():
    flags = every_flag()
    missing = sorted(flags - set(CASES))
    stale = sorted(set(CASES) - flags)
    assert not missing, f"flags without a case in CASES (add a refusal or a scenario that shows the effect): {missing}"
    assert not stale, f"cases for flags that no longer exist: {stale}"
    for case in CASES.values():
        assert isinstance(case, tuple) or case in globals(), case


def magic(ip, line: str):
    """``%distrain line`` as a notebook runs it: the handler's value, or the error it raised."""
    return ip.run_line_magic("distrain", line)


REFUSALS = sorted((k, v) for k, v in CASES.items() if isinstance(v, tuple))


@pytest.mark.parametrize("key, case", REFUSALS, ids=[f"{w} {f}" for (w, f), _ in REFUSALS])
def test_refused_flags_say_what_was_wrong_and_change_nothing(shell2, ranks2, key, case):
    _, line, fragment = case
    assert key[1] in line or key[0].split()[-1] in line
    pids = [p.pid for p in ranks2.procs]
    ranks2.execute("sentinel = 11")
    with pytest.raises(Exception) as err:
        magic(shell2, line)
    message = str(err.value)
    assert fragment in message, message
    if isinstance(err.value, UsageError):
        assert "\n" not in message, message
    assert api.current() is ranks2 and [p.pid for p in ranks2.procs] == pids
    assert ranks2.pull("sentinel") == [11, 11]


def test_plan_flags(ipshell, capsys):
    """`%distrain plan` is arithmetic in the kernel: each flag changes the printed plan."""
    shell = ipshell
    for flag, (with_, without) in PLAN_CASES.items():
        magic(shell, f"plan {PLAN_BASE} {with_}")
        out = capsys.readouterr().out
        magic(shell, f"plan {PLAN_BASE} {without}")
        assert out != capsys.readouterr().out, f"`plan ... {with_}` printed the same plan as without {flag}"
    assert "DOES NOT FIT" in out or "fits" in out.lower(), out


def test_cell_flags(shell2, ranks2, capsys):
    """--ranks / --timeout / --grace / --fail-fast / --stream / --no-stream on real ranks."""
    import sys
    import time

    assert shell2.run_cell("%%distrain --ranks 1\nonly_one = 5").success
    assert ranks2.execute("print('only_one' in globals())") is not None
    capsys.readouterr()
    assert shell2.run_cell("%%distrain\nprint('only_one' in globals())").success
    assert [l for l in capsys.readouterr().out.splitlines() if l.startswith("[rank")] == [
        "[rank 0] False",
        "[rank 1] True",
    ]
    r = shell2.run_cell("%%distrain --timeout 0.5\nimport time\ntime.sleep(1.5)")
    assert not r.success and "0.5" in str(r.error_in_exec)
    ranks2.interrupt() if hasattr(ranks2, "interrupt") else None
    ranks2.execute("import time; time.sleep(0)", timeout=30)  # the ranks answer again
    # a failing rank 0 while rank 1 sleeps 2 s: --fail-fast interrupts it at once, --grace 5 lets it finish
    code = "from workbench import engine\nimport time\nif engine.rank == 0: raise ValueError('boom')\ntime.sleep(2)\nfinished = 1"
    for flags, finished in (("--fail-fast", False), ("--grace 5", True)):
        ranks2.execute("globals().pop('finished', None)")
        t0 = time.monotonic()
        r = shell2.run_cell(f"%%distrain {flags}\n{code}")
        took = time.monotonic() - t0
        assert not r.success and "rank 0" in str(r.error_in_exec).replace("rank(s) 0", "rank 0")
        got = ranks2.pull("finished", ranks=[1]) if finished else None
        if finished:
            assert got == [1], flags
        else:
            assert took < 1.8, (flags, took)
            assert ranks2.execute("print(1)") is not None
    capsys.readouterr()

    # --stream shows rank output while the cell still runs; --no-stream only when it ends
    class Clock:
        def __init__(self, real):
            self.real, self.seen = real, []

        def write(self, text):
            self.seen.append((time.monotonic(), text))
            return self.real.write(text)

        def flush(self):
            self.real.flush()

        def __getattr__(self, name):
            return getattr(self.real, name)

    for flags, live in (("--stream", True), ("--no-stream", False)):
        clock = Clock(sys.stdout)
        sys.stdout = clock
        try:
            t0 = time.monotonic()
            r = shell2.run_cell(f"%%distrain {flags}\nimport time\nprint('early', flush=True)\ntime.sleep(1.5)")
            t1 = time.monotonic()
        finally:
            sys.stdout = clock.real
        assert r.success
        first = min(t for t, text in clock.seen if "early" in text)
        assert (first - t0 < 1.0) is live and (t1 - first < 0.5) is not live, (flags, first - t0, t1 - first)


def _trainer_facts() -> dict:
    """On a rank: what the trainer runs with (step, lr, micro-batches, rows per micro-batch, layout)."""
    from workbench.engine import trainer

    t = trainer.current()
    batch = t._source.peek(0)
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    return {
        "step": t.step,
        "lr": t.optimizer.param_groups[0]["lr"],
        "grad_accum": t.config.grad_accum,
        "rows": int(x.shape[0]),
        "layout": repr(t.prepared),
        "opt_step": int(max((float(st["step"]) for st in t.optimizer.state.values()), default=0)),
    }


def _clean(ranks) -> None:
    from conftest import clean_trainer

    from workbench.notebook import dashboard, session

    ranks.apply(clean_trainer, timeout=60)
    sess = session.of(ranks)
    dashboard.close(sess)
    sess.checkpoints.autosave = None


def test_train_flags(shell2, ranks2, tmp_path, capsys):
    """train start/wait, dashboard, timeline and profile flags on a real trainer (the tiny GPT)."""
    from workbench.notebook import session, training

    _clean(ranks2)
    try:
        # no trainer yet: --lr would have nothing to change, so it is refused and nothing is built
        with pytest.raises(UsageError, match="--lr change the trainer on the ranks, and there is none yet"):
            magic(shell2, "train start --lr 3e-4 --no-dashboard")
        assert [s["state"] for s in training.status()] == ["none", "none"]
        magic(
            shell2,
            "train start --gpt tiny --strategy fsdp2 --batch-size 4 --lr 3e-4 --grad-accum 2 "
            "--steps 2 --step-timeout 120 --no-dashboard",
        )
        magic(shell2, "train wait --timeout 120")
        facts = ranks2.apply(_trainer_facts)
        assert [f["step"] for f in facts] == [2, 2]
        assert all(f["lr"] == 3e-4 and f["grad_accum"] == 2 and "fsdp2" in f["layout"] for f in facts), facts
        assert all(f["rows"] == 4 // 2 for f in facts), facts  # 4 rows per step over 2 data-parallel ranks
        assert session.of(ranks2).dashboard.live is None  # --no-dashboard
        assert session.of(ranks2).runs.current.watchdog.timeout == 120.0  # --step-timeout
        first_run = session.of(ranks2).runs.started
        # without --gpt: --lr and --grad-accum change the trainer already there; --batch-size cannot
        with pytest.raises(UsageError, match="--batch-size sizes the teaching GPT"):
            magic(shell2, "train start --batch-size 2")
        magic(shell2, "train start --steps 1 --lr 1e-4 --grad-accum 1")
        magic(shell2, "train wait --timeout 120")
        facts = ranks2.apply(_trainer_facts)
        assert [(f["step"], f["lr"], f["grad_accum"]) for f in facts] == [(3, 1e-4, 1)] * 2
        assert session.of(ranks2).dashboard.live is not None  # no --no-dashboard: it opened
        # train wait --timeout: a long run is not waited for past the timeout
        magic(shell2, "train start --steps 100000 --no-dashboard")
        try:
            with pytest.raises(UsageError, match="training is already running, so --lr would not start a run"):
                magic(shell2, "train start --lr 5e-5")
            assert {f["lr"] for f in ranks2.apply(_trainer_facts)} == {1e-4}  # refused before anything changed
            with pytest.raises(TimeoutError):
                magic(shell2, "train wait --timeout 0.3")
            # profile --timeout bounds the wait for steps that take longer than that
            # (100 profiled steps of 2 gloo ranks take far longer than 0.1 s)
            with pytest.raises(RuntimeError, match="no trace after 0 s"):
                magic(shell2, f"profile --steps 100 --timeout 0.1 --dir {tmp_path / 't'}")
        finally:
            magic(shell2, "train stop")
            magic(shell2, "train wait --timeout 120")
        # dashboard --export / --run: a standalone HTML of the first run
        html = tmp_path / "dash.html"
        magic(shell2, f"dashboard --run {first_run} --export {html}")
        assert html.stat().st_size > 1000 and "plotly" in html.read_text().lower()
        assert session.of(ranks2).dashboard.live.run == first_run
        # timeline: --steps rows per rank, --ranks, --run (a new trainer is a new run), --table
        magic(shell2, "train start --gpt tiny --steps 1 --no-dashboard")
        magic(shell2, "train wait --timeout 120")
        assert session.of(ranks2).runs.started != first_run
        old = magic(shell2, f"timeline --steps 2 --ranks 1 --run {first_run} --table")
        new = magic(shell2, "timeline --steps 2 --table")
        assert set(old["rank"]) == {1} and len(old) == 2 and min(old["step"]) > 1, old
        assert sorted(new["rank"]) == [0, 1] and set(new["step"]) == {1}, new
        assert type(magic(shell2, "timeline --steps 1")).__name__ == "Figure"
        # profile: --steps, --dir; --code (profiles code instead of steps) with --ranks; --timeout bounds the wait
        prof = magic(shell2, f"profile --steps 1 --dir {tmp_path / 'p'}")
        assert sorted(prof.files) == [0, 1] and prof.files[1].startswith(str(tmp_path / "p"))
        with open(prof.files[1]) as f:
            assert sum(e.get("name", "").startswith("ProfilerStep#") for e in json.load(f)["traceEvents"]) == 1
        prof = magic(shell2, f"profile --code 'y = sum(range(1000))' --ranks 0 --dir {tmp_path / 'c'}")
        assert list(prof.files) == [0] and os.path.exists(prof.files[0])
        # one rank of an idle trainer cannot step alone: refused at once, not after --timeout
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=r"profiling rank\(s\) 1 alone cannot start them"):
            magic(shell2, f"profile --steps 1 --ranks 1 --timeout 60 --dir {tmp_path / 'i'}")
        assert time.monotonic() - t0 < 30
    finally:
        _clean(ranks2)
    capsys.readouterr()


def _safetensors_dtypes(path) -> set[str]:
    """The dtypes a .safetensors file declares (its JSON header), read without torch."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def test_ckpt_flags(shell2, ranks2, tmp_path, capsys):
    """Every ckpt action's flags on a trained tiny GPT: folders, tags, async, model-only, retention, export dtype."""
    from workbench.notebook import session
    from workbench.shared.checkpoint import catalog

    d, auto = tmp_path / "ck", tmp_path / "auto"
    _clean(ranks2)
    try:
        magic(shell2, "train start --gpt tiny --steps 2 --no-dashboard")
        magic(shell2, "train wait --timeout 120")
        capsys.readouterr()
        magic(shell2, f"ckpt save --dir {d} --tag first --async")
        assert "in the background" in capsys.readouterr().out  # --async: returns before the write ends
        magic(shell2, "ckpt wait")
        magic(shell2, f"ckpt save --dir {d} --model-only")
        table = magic(shell2, f"ckpt list --dir {d}")
        assert list(table["tag"]) == ["first", ""] and set(table["step"]) == {2}
        full, model_only = table["size_mb"]
        assert model_only < full / 2, (full, model_only)  # AdamW's two moments were left out
        magic(shell2, f"ckpt verify first --dir {d}")
        assert ": good:" in capsys.readouterr().out
        magic(shell2, "train start --steps 1 --no-dashboard")  # step 3: the optimizer has stepped 3 times
        magic(shell2, "train wait --timeout 120")
        magic(shell2, f"ckpt load first --dir {d} --model-only")
        assert "(model only: fresh optimizer)" in capsys.readouterr().out
        assert [f["opt_step"] for f in ranks2.apply(_trainer_facts)] == [3, 3]  # not taken from the checkpoint
        magic(shell2, f"ckpt load first --dir {d}")
        assert [f["opt_step"] for f in ranks2.apply(_trainer_facts)] == [2, 2]  # restored with the model
        out = tmp_path / "w.safetensors"
        magic(shell2, f"ckpt export {out} first --dir {d} --dtype bf16")
        assert _safetensors_dtypes(out) == {"BF16"}
        magic(shell2, f"ckpt export {out} first --dir {d}")
        assert _safetensors_dtypes(out) == {"F32"}
        # --hf writes a transformers folder; the tiny GPT is not a transformers model, so it is refused
        # (the export itself, loaded by from_pretrained: test_hf_weights.py)
        with pytest.raises(ValueError, match="keeps no Hugging Face config"):
            magic(shell2, f"ckpt export {tmp_path / 'hf'} first --dir {d} --hf")
        assert not (tmp_path / "hf").exists()
        # --merged is for a peft adapter's checkpoint (its export loaded back: test_lora.py); refused here
        with pytest.raises(ValueError, match="holds a whole model, not a peft adapter: --merged"):
            magic(shell2, f"ckpt export {tmp_path / 'merged'} first --dir {d} --merged")
        assert not (tmp_path / "merged").exists()
        # auto-save every step, the newest 2 kept, written before training goes on (the default);
        # --async writes in the background; --off stops it
        magic(shell2, f"ckpt autosave --dir {auto} --every 1 --keep 2")
        assert session.of(ranks2).checkpoints.autosave == {"every": 1, "keep": 2, "async_": False, "root": str(auto)}
        magic(shell2, "train start --steps 3 --no-dashboard")
        magic(shell2, "train wait --timeout 120")
        magic(shell2, "ckpt wait")
        steps = sorted(magic(shell2, f"ckpt list --dir {auto}")["step"])
        assert steps == [4, 5], steps
        assert [m.async_save for _, m in catalog.entries(str(auto))] == [False, False]
        magic(shell2, f"ckpt autosave --dir {tmp_path / 'bg'} --every 1 --async")
        magic(shell2, "train start --steps 1 --no-dashboard")
        magic(shell2, "train wait --timeout 120")
        magic(shell2, "ckpt wait")
        assert [m.async_save for _, m in catalog.entries(str(tmp_path / "bg"))] == [True]
        magic(shell2, "ckpt autosave --off")
        magic(shell2, "train start --steps 1 --no-dashboard")
        magic(shell2, "train wait --timeout 120")
        magic(shell2, "ckpt wait")
        assert sorted(magic(shell2, f"ckpt list --dir {auto}")["step"]) == [4, 5]
        magic(shell2, f"ckpt delete --dir {auto} --keep 1")
        assert list(magic(shell2, f"ckpt list --dir {auto}")["step"]) == [5]
    finally:
        _clean(ranks2)
    capsys.readouterr()


def test_view_flags(shell2, ranks2, capsys):
    """push/pull --ranks and where --ranks/--full/--timeout on the shared ranks."""
    shell2.user_ns["pushed_here"] = 3
    magic(shell2, "push pushed_here --ranks 1")
    assert ranks2.apply(_has, "pushed_here") == [False, True]
    assert magic(shell2, "pull pushed_here --ranks 1") == [3]
    ranks2.execute("del pushed_here", ranks=[1])
    capsys.readouterr()
    magic(shell2, "where --ranks 1")
    short = capsys.readouterr().out
    magic(shell2, "where --ranks 1 --full")
    full = capsys.readouterr().out
    assert {l.split("]")[0] for l in short.splitlines()} == {"[rank 1"}
    assert "Thread" in full and len(full.splitlines()) > len(short.splitlines())
    magic(shell2, "where --ranks 1 --timeout 1e-9")  # no time to answer SIGUSR1
    assert "no stack arrived" in capsys.readouterr().out
    # --grouped: the two idle ranks are at the same place, shown once; --per-rank: one each
    magic(shell2, "where --grouped")
    grouped = capsys.readouterr().out
    assert grouped.startswith("1 place(s) for 2 ranks:") and "[ranks 0-1] " in grouped, grouped
    magic(shell2, "where --per-rank")
    assert {l.split("]")[0] for l in capsys.readouterr().out.splitlines()} == {"[rank 0", "[rank 1"}
    # the cell magic's --grouped / --per-rank
    assert shell2.run_cell("%%distrain --grouped\nprint('alike')").success
    assert capsys.readouterr().out.splitlines()[-1] == "[ranks 0-1] alike"
    assert shell2.run_cell("%%distrain --per-rank\nprint('alike')").success
    assert capsys.readouterr().out.splitlines()[-2:] == ["[rank 0] alike", "[rank 1] alike"]


def test_output_and_logs_flags(shell2, ranks2, capsys):
    """%%distrain --output (a size, all, the default) and logs --ranks/--tail/--grep/--grouped/--per-rank."""
    flood = "%%distrain{}\nfor i in range(30_000):\n    print(f'line {{i:05d}}')"
    kept = {}
    for flags in ("", " --output 2k", " --output all"):
        capsys.readouterr()
        assert shell2.run_cell(flood.format(flags)).success
        out = capsys.readouterr().out
        kept[flags] = [l for l in out.splitlines() if l.startswith("[rank 1] line ")]
        cut = [l for l in out.splitlines() if l.startswith("[rank 1] … ") and "cut here" in l]
        assert len(cut) == (0 if flags == " --output all" else 1), (flags, cut)
    assert len(kept[" --output all"]) == 30_000  # everything
    assert len(kept[" --output 2k"]) < 400 < len(kept[""]) < 30_000  # a head and a tail, of the size asked
    magic(shell2, "logs --ranks 1 --tail 3")
    out = capsys.readouterr().out
    assert [l for l in out.splitlines() if l.startswith("[")] == [
        f"[rank 1] line {i:05d}" for i in (29997, 29998, 29999)
    ]
    magic(shell2, "logs --grep 'line 01234$' --per-rank")
    out = capsys.readouterr().out
    for rank in (0, 1):
        body = [l for l in out.splitlines() if l.startswith(f"[rank {rank}] ")]
        assert body[0] == f"[rank {rank}] 3 line(s) match 'line 01234$':", out  # one per flood above
        assert all(l.endswith(": line 01234") for l in body[1:]) and len(body) == 4, body
    magic(shell2, "logs --tail 1 --grouped")
    assert "[ranks 0-1] line 29999" in capsys.readouterr().out


PREP_BUILD = (
    "%%distrain\nimport torch\nfrom workbench.models import GPT, GPTConfig\ntorch.manual_seed(0)\n"
    "net = GPT(GPTConfig.tiny())\nopt = lambda ps: torch.optim.AdamW(ps, lr=1e-3)\n"
)


def _forget_prepared() -> bool:
    import __main__
    from workbench.engine import session
    from workbench.strategies import reset_accelerate_state

    if session.has_prepared():
        session.prepared().close()
    session.clear()
    reset_accelerate_state()
    for name in ("net", "opt", "prepared", "torch", "GPT", "GPTConfig", "logits"):
        vars(__main__).pop(name, None)
    return True


def test_prepare_and_layout_flags(shell2, ranks2, capsys):
    """prepare --model-var/--optimizer-var/--blocks name the rank variables and blocks; layout --max/--match/--tensor."""
    try:
        assert shell2.run_cell(PREP_BUILD).success
        magic(shell2, "prepare fsdp2 --model-var net --optimizer-var opt --blocks layers.0")
        out = capsys.readouterr().out
        assert "blocks (rank 0): layers.0\n" in out + "\n", out  # only the block named, not layers.1
        assert ranks2.apply(_type_of, "net") == ["FSDPGPT", "FSDPGPT"]  # --model-var: `net` was laid out
        assert ranks2.apply(_type_of, "opt") == ["AdamW", "AdamW"]  # --optimizer-var: the factory `opt` was used
        fig = magic(shell2, "layout --max 3")
        assert len(fig.data[0].y) == 3
        fig = magic(shell2, "layout --match wq")
        assert fig.data[0].y and all("wq" in name for name in fig.data[0].y), fig.data[0].y
        fig = magic(shell2, "layout --tensor layers.0.attention.wq.weight")
        assert "layers.0.attention.wq.weight" in fig.layout.title.text
    finally:
        ranks2.apply(_forget_prepared)
        capsys.readouterr()


def test_prepare_compile(shell2, ranks2, capsys):
    """`prepare ddp compile`: every block runs through torch.compile's wrapper (not executed here:
    compiling takes minutes on 2 cores); without it no block is wrapped."""
    for spec, expect in (("ddp compile", [True, True]), ("ddp", [False, False])):
        try:
            assert shell2.run_cell(PREP_BUILD).success
            magic(shell2, f"prepare {spec} --model-var net --optimizer-var opt")
            assert ranks2.apply(_compiled_only) == [{"compiled": expect}] * 2, spec
        finally:
            ranks2.apply(_forget_prepared)
    capsys.readouterr()


@pytest.mark.parametrize(
    "spec, says",
    [
        ("fsdp2 cpu_offload=true", "cpu_offload=True on a CPU device"),
        ("fsdp2 dtype=fp16", "param_dtype='fp16' is not supported on CPU"),
    ],
)
def test_prepare_cpu_offload_and_fp16_are_refused_on_cpu(shell2, ranks2, capsys, spec, says):
    """CPU offload and fp16 need CUDA (their effect: tests/gpu); on gloo ranks they are refused before
    any rank changes, saying what would work."""
    try:
        assert shell2.run_cell(PREP_BUILD).success
        with pytest.raises(Exception, match=re.escape(says)) as err:
            magic(shell2, f"prepare {spec} --model-var net --optimizer-var opt")
        assert "nothing was changed on the ranks" in str(err.value)
        assert ranks2.apply(_type_of, "net") == ["GPT", "GPT"]
    finally:
        ranks2.apply(_forget_prepared)
        capsys.readouterr()


def _compiled_only() -> dict:
    import __main__

    net = vars(__main__)["net"]
    return {"compiled": [b._compiled_call_impl is not None for b in getattr(net, "module", net).layers.values()]}


def _has(name: str) -> bool:
    import __main__

    return name in vars(__main__)


def _type_of(name: str) -> str:
    import __main__

    return type(vars(__main__)[name]).__name__


PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def test_image_output_from_a_rank_reaches_the_notebook(shell2):
    """A PNG displayed on rank 1 is published in the notebook as image/png, byte for byte."""
    published = []
    original = shell2.display_pub.publish
    shell2.display_pub.publish = lambda data, metadata=None, **kw: published.append(data)
    try:
        shell2.user_ns["png_bytes"] = PNG
        magic(shell2, "push png_bytes --ranks 1")
        r = shell2.run_cell(
            "%%distrain --ranks 1\nfrom IPython.display import Image, display\n"
            "display(Image(data=png_bytes))\ndel png_bytes"
        )
    finally:
        shell2.display_pub.publish = original
    assert r.success, r.error_in_exec
    images = [d["image/png"] for d in published if "image/png" in d]
    assert len(images) == 1
    got = images[0] if isinstance(images[0], bytes) else base64.b64decode(images[0])
    assert got == PNG


SETTINGS = (
    "import torch\nfrom workbench.engine import runtime as _rt, trainer as _tr\n"
    "_settings = {'world': _rt.context().world_size, 'timeout': _rt.context().timeout_s, "
    "'threads': torch.get_num_threads(), 'by_setup': globals().get('built_by_setup', False), "
    "'step': _tr._CURRENT.step if _tr._CURRENT else None}"
)


def _rank_settings_of(rs) -> list[dict]:
    """What each rank runs with (asked with code: private ranks cannot import this test module)."""
    rs.execute(SETTINGS)
    return rs.pull("_settings")


SETUP = "from workbench.engine import control\ncontrol.build_default('ddp', model='tiny')\nbuilt_by_setup = True\n"


def test_start_restart_load_flags(fresh_ranks, tmp_path, capsys):
    """start / restart / restart --load on private ranks: size, backend, collective timeout,
    threads, auto mode, the checkpoint to load, the setup code and the checkpoint folder."""
    from IPython.testing.globalipapp import get_ipython

    from workbench.notebook import auto_cells

    ip = get_ipython()
    ip.run_line_magic("load_ext", "workbench")
    try:
        magic(ip, "start -n 1 --backend gloo --collective-timeout 77 --threads 2 --auto")
        rs = api.current()
        fresh_ranks.started.append(rs)
        assert auto_cells.is_on(ip)  # --auto
        assert rs.info[0]["backend"] == "gloo"
        assert _rank_settings_of(rs) == [{"world": 1, "timeout": 77.0, "threads": 2, "by_setup": False, "step": None}]
        magic(ip, "auto off")
        # a checkpoint to come back to (tagged, then a newer one), then restart --load WHICH -n/--setup/--dir
        magic(ip, "train start --gpt tiny --steps 2 --no-dashboard")
        magic(ip, "train wait --timeout 120")
        magic(ip, f"ckpt save --dir {tmp_path} --tag two")
        magic(ip, "train start --steps 1 --no-dashboard")
        magic(ip, "train wait --timeout 120")
        magic(ip, f"ckpt save --dir {tmp_path}")
        ip.user_ns["SETUP"] = SETUP
        with pytest.raises(UsageError, match="--setup and --dir go with --load"):
            magic(ip, f"restart --dir {tmp_path}")
        magic(ip, f"restart --load two --setup SETUP --dir {tmp_path} -n 2 --collective-timeout 40 --backend gloo")
        settings = _rank_settings_of(api.current())
        assert [(s["world"], s["timeout"], s["by_setup"], s["step"]) for s in settings] == [(2, 40.0, True, 2)] * 2
        magic(ip, "restart -n 1")  # the same settings, another size; nothing loaded
        settings = _rank_settings_of(api.current())
        assert [(s["world"], s["timeout"], s["by_setup"], s["step"]) for s in settings] == [(1, 40.0, False, None)]
    finally:
        auto_cells.turn_off(ip)
        ip.user_ns.pop("SETUP", None)
        from workbench.notebook import dashboard, session

        sess = session.current()
        if sess is not None:
            dashboard.close(sess)
    capsys.readouterr()


def test_named_set_flags(shell2, ranks2, capsys):
    """`start --session` makes a set the cell can reach with `%%distrain --session` without switching;
    `--session NAME` on a command acts on that set for the line only; a taken name and an unknown one
    are refused by name; `stop --session` stops only that set; `restart --session` restarts only it."""
    from workbench.notebook import session

    had = set(api.sessions())
    try:
        magic(shell2, "start -n 1 --session flagwalk --backend gloo")
        with session.using(ranks2):
            with pytest.raises(Exception, match="flagwalk"):
                magic(shell2, "start -n 1 --session flagwalk")
            shell2.run_cell_magic("distrain", "--session flagwalk", "on_flagwalk = 5")
            flagwalk = api.session("flagwalk").rankset
            assert flagwalk.pull("on_flagwalk") == [5]
            with pytest.raises(Exception, match="nope"):
                shell2.run_cell_magic("distrain", "--session nope", "x = 1")
            with pytest.raises(Exception, match="nope"):
                magic(shell2, "stop --session nope")
            # --session on one line: the named set answers, the current one stays current
            assert list(magic(shell2, "status --session flagwalk").index) == [0]  # 1 rank, not ranks2's 2
            shell2.user_ns["for_flagwalk"] = 7
            magic(shell2, "push for_flagwalk --session flagwalk")
            assert magic(shell2, "pull for_flagwalk --session flagwalk") == [7]
            assert ranks2.apply(_has, "for_flagwalk") == [False, False]
            capsys.readouterr()
            magic(shell2, "where --session flagwalk")
            assert {l.split("]")[0] for l in capsys.readouterr().out.splitlines()} == {"[rank 0"}
            shell2.run_cell_magic("distrain", "--session flagwalk", "print('printed on flagwalk')")
            capsys.readouterr()
            magic(shell2, "logs --session flagwalk --tail 1")
            logged = capsys.readouterr().out.splitlines()
            assert logged[0].startswith("logs of ranks 0 (") and logged[1:] == ["[rank 0] printed on flagwalk"], logged
            assert len(magic(shell2, "train status --session flagwalk")) == 1
            magic(shell2, "ckpt wait --session flagwalk")
            assert "no save in flight" in capsys.readouterr().out
            with pytest.raises(UsageError, match="`status` acts on one session"):
                magic(shell2, "status --session flagwalk,other")
            assert api.current() is ranks2
            pids = [p.pid for p in flagwalk.procs]
            magic(shell2, "restart --session flagwalk")
            again = api.session("flagwalk").rankset
            assert again is not flagwalk and again.world_size == 1 and [p.pid for p in again.procs] != pids
            assert api.current() is ranks2 and ranks2.running
            # dashboard --session: one session's dashboard; several: a live overlay, traces named by
            # session; unknown names and one-session flags beside several are refused
            magic(shell2, "dashboard --session flagwalk")
            assert api.session("flagwalk").dashboard.live is not None and session.of(ranks2).dashboard.live is None
            over = session.KERNEL.overlays.get(("flagwalk",))
            assert over is None
            import workbench

            over = workbench.dashboard(session=["flagwalk"], show=False)
            assert [t.name for t in over.panel("loss")] == ["flagwalk"] and not over.closed
            with pytest.raises(UsageError, match="no rank set named 'nope'; the sessions are: flagwalk"):
                magic(shell2, "dashboard --session flagwalk,nope")
            with pytest.raises(UsageError, match="--run goes with one session's dashboard"):
                magic(shell2, "dashboard --session flagwalk,other --run r1")
            with pytest.raises(UsageError, match="expected session names like ddp,fsdp"):
                magic(shell2, "dashboard --session ,")
            magic(shell2, "stop --session flagwalk")
            assert not api.session("flagwalk").running
            assert over.closed and ("flagwalk",) not in session.KERNEL.overlays  # none of its sessions runs
            assert api.current() is ranks2
    finally:
        sess = session.KERNEL.by_name.get("flagwalk")
        if sess is not None and sess.running:
            api.stop("flagwalk")
        for name in set(api.sessions()) - had:  # stopped sessions stay listed: the next test starts without it
            session.KERNEL.by_name.pop(name)
    capsys.readouterr()


def test_track_flags(shell2, ranks2, tmp_path):
    """`track start KIND --dir D --metrics loss`: each tracker's run is written under D and holds the
    loss series only (read back with the tracker's own reader); tests/ranks/test_trackers.py
    checks the series themselves against workbench.metrics()."""
    import glob

    import tracker_readers

    from workbench.notebook import stream, trackers

    stream.attach(ranks2)
    run = f"flagwalk-track-{time.time_ns()}"
    dirs = {k: tmp_path / k for k in ("tensorboard", "mlflow", "wandb", "trackio")}
    dirs["trackio"] = tracker_readers.trackio_dir(dirs["trackio"])
    try:
        for kind, folder in dirs.items():
            magic(shell2, f"track start {kind} --dir {folder} --metrics loss")
        shell2.run_cell_magic(
            "distrain",
            "",
            "from workbench import engine\nfrom workbench.engine import publisher\n"
            f"for s in (1, 2):\n    engine.report(step=s, loss=1.0 / s, run={run!r}, lr=0.1)\npublisher.flush()",
        )
        store = stream.attach(ranks2).store
        assert store.wait(lambda st: len(st.snapshot_rows(run)) == 4, timeout=60)
        names = {info["tracker"]: info["run"] for info in magic(shell2, "track list")}
        assert magic(shell2, "track stop") is None and api.current() is ranks2
        assert trackers.tracking() == []
    finally:
        for info in trackers.tracking():
            trackers.untrack(info["tracker"])
        import wandb

        wandb.teardown()
    loss_only = {f"{run}/loss/rank0", f"{run}/loss/rank1", f"{run}/loss/mean"}

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(dirs["tensorboard"] / names["tensorboard"]))
    acc.Reload()
    assert {t for t in acc.Tags()["scalars"] if t.startswith(run)} == loss_only

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{dirs['mlflow']}/mlflow.db")
    (mrun,) = client.search_runs([client.get_experiment_by_name("workbench").experiment_id])
    assert {k for k in mrun.data.metrics if k.startswith(run)} == loss_only

    (wfile,) = glob.glob(str(dirs["wandb"] / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert {
        k for row in tracker_readers.history(wfile) for k in row if k.startswith(run + "/") and k != f"{run}/step"
    } == loss_only

    from trackio.sqlite_storage import SQLiteStorage

    logs = SQLiteStorage.get_logs("workbench", names["trackio"])
    assert {k for row in logs for k in row if k.startswith(run)} == loss_only
