"""The dry run's parent: ``python -m workbench.engine.dry_run.server``, started by the notebook.

Reads a cloudpickled :class:`workbench.shared.dry_run.DryRunRequest` on stdin and writes one
JSON line on stdout (a :class:`~workbench.shared.dry_run.DryRunResult` dict, or ``{"error"}``).
It imports torch and the strategies once, runs the strategy's own checks on the meta model
(a layout that cannot work ends there), then forks a process per pipeline stage, all at once
(they exchange metadata through it: :mod:`.relay`), and one more per group of ranks no built
rank stands for (:mod:`.grouping`). How it runs: docs/dry-run.md."""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys
import time
import traceback

__all__ = ["main"]


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _stage_of(rank: int, shape, names) -> int:
    from .grouping import coords_of

    return coords_of(rank, shape)[names.index("pp")] if "pp" in names else 0


class _Wave:
    """Forked position processes and the relay between them."""

    def __init__(self, model, request, fake_mode, vocab: int):
        self.model, self.request, self.fake_mode, self.vocab = model, request, fake_mode, vocab
        self.store: dict[tuple, bytes] = {}
        self.waiting: dict[tuple, list[socket.socket]] = {}

    def run(self, ranks: list[int], group: set[int]) -> dict[int, dict]:
        from .relay import recv_msg, send_msg

        sel = selectors.DefaultSelector()
        children: dict[int, tuple[int, socket.socket]] = {}
        for rank in ranks:
            mine, theirs = socket.socketpair()
            pid = os.fork()
            if pid == 0:  # the position
                mine.close()
                self._child(rank, theirs, rank in group)
            theirs.close()
            children[rank] = (pid, mine)
            sel.register(mine, selectors.EVENT_READ, rank)
        results: dict[int, dict] = {}
        try:
            while len(results) < len(ranks):
                for key, _ in sel.select():
                    rank = key.data
                    sock = key.fileobj
                    try:
                        msg = recv_msg(sock)
                    except EOFError:
                        raise RuntimeError(f"rank {rank}'s dry-run process ended without a report") from None
                    kind = msg[0]
                    if kind == "send":
                        self.store.setdefault(msg[1], msg[2])
                        for waiter in self.waiting.pop(msg[1], []):
                            send_msg(waiter, msg[2])
                    elif kind == "recv":
                        if msg[1] in self.store:
                            send_msg(sock, self.store[msg[1]])
                        else:
                            self.waiting.setdefault(msg[1], []).append(sock)
                    elif kind == "error":
                        raise _PositionFailed(msg[1], msg[2])
                    else:
                        results[rank] = msg[1]
                        sel.unregister(sock)
        finally:
            for rank, (pid, sock) in children.items():
                if rank not in results:  # a position failed: the others end with it
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                sock.close()
                os.waitpid(pid, 0)
            sel.close()
        return results

    def _child(self, rank: int, sock: socket.socket, group: bool) -> None:
        from ...strategies import PrepareError, SpecError
        from .position import run_position
        from .relay import send_msg

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # the parent's stdout carries its one JSON line
        code = 0
        try:
            report = run_position(
                self.model, self.request, rank, fake_mode=self.fake_mode, vocab=self.vocab, sock=sock, group=group
            )
            send_msg(sock, ("result", report))
        except (SpecError, PrepareError, ValueError) as exc:
            send_msg(sock, ("error", _one_line(exc), traceback.format_exc()))
        except BaseException as exc:  # noqa: BLE001  (reported to the parent, which ends the rest)
            send_msg(sock, ("error", f"rank {rank}: {type(exc).__name__}: {_one_line(exc)}", traceback.format_exc()))
            code = 1
        finally:
            sys.stderr.flush()
            os._exit(code)


class _PositionFailed(Exception):
    def __init__(self, line: str, detail: str):
        super().__init__(line)
        self.line, self.detail = line, detail


def _positions(first: dict[int, dict], shape, names, world: int) -> list[tuple[int, list[int]]]:
    """``[(rank to build, ranks it stands for)]`` from the stage representatives' signatures."""
    groups: dict[tuple[int, int], list[int]] = {}
    for rep in first.values():
        if "signatures" not in rep:
            continue
        for r, cls in rep["signatures"].items():
            groups.setdefault((_stage_of(int(r), shape, names), cls), []).append(int(r))
    out = []
    for (_, _), ranks in sorted(groups.items()):
        ranks.sort()
        built = [r for r in ranks if r in first]
        out.append((built[0] if built else ranks[0], ranks))
    covered = sorted(r for _, rs in out for r in rs)
    if covered != list(range(world)):
        raise RuntimeError(f"the grouping covers {len(covered)} of {world} ranks")
    return out


def dry_run(request) -> dict:
    """Run ``request`` (see the module doc); the result dict."""
    t0 = time.perf_counter()
    import torch

    from ...strategies import ModelHints, PrepareError, SpecError, StrategySpec, check_layout, model_config_of
    from . import position  # noqa: F401  (imported before the forks)
    from .fake_mode import DryFakeMode
    from .models import build_on_meta, layout_facts, shape_of

    torch.set_num_threads(1)
    t1 = time.perf_counter()
    world = request.world
    try:
        model = build_on_meta(request.build, request.seq)
        spec = StrategySpec.parse(request.spec)
        resolved = spec.validate(world, model_config_of(model), device_type="cpu")
        if resolved.kind in ("none", "zero"):
            raise SpecError(
                f"kind={resolved.kind!r}: the dry run lays out the native strategies (fsdp2, tp, pp and their "
                "degrees); DeepSpeed ZeRO builds its engine on live ranks"
            )
        hints = ModelHints(blocks=request.blocks, tp_plan=request.tp_plan, pp_boundaries=request.pp_boundaries)
        check_layout(model, resolved, world, hints)
    except (SpecError, PrepareError, ValueError, TypeError) as exc:
        return {"error": _one_line(exc)}
    shape = shape_of(model, request.seq)
    vocab = (
        shape["vocab"]
        if shape
        else next((m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)
    )
    if vocab is None:
        return {
            "error": "the model has no nn.Embedding and no config naming its vocabulary; the dry run feeds it token ids"
        }
    facts = layout_facts(model, resolved, world, hints, vocab)
    fake_mode = DryFakeMode()
    with fake_mode:
        model.to_empty(device="cpu")
    plan = resolved.mesh_plan(world)
    shape_, names = tuple(plan.shape), tuple(plan.dim_names)
    t2 = time.perf_counter()
    wave = _Wave(model, request, fake_mode, vocab)
    try:
        if request.every_rank:
            first = wave.run(list(range(world)), group=set(range(world)))
        else:
            pp = plan.size("pp")
            reps = [s * (world // pp) for s in range(pp)]
            first = wave.run(reps, group=set(reps))
        positions = _positions({r: first[r] for r in first if r in _reps(first, shape_, names)}, shape_, names, world)
        missing = [r for r, _ in positions if r not in first]
        more = wave.run(missing, group=set()) if missing else {}
    except _PositionFailed as exc:
        return {"error": exc.line, "detail": exc.detail}
    t3 = time.perf_counter()
    built = {**first, **more}
    out_positions = []
    for i, (rank, ranks) in enumerate(positions):
        rep = dict(built[rank])
        for k in ("signatures", "mesh", "spec"):
            rep.pop(k, None)
        out_positions.append({"position": i, "ranks": ranks, **rep})
    checked = {}
    if request.every_rank:
        keys = ("param_bytes", "grad_bytes", "optim_bytes", "activation_bytes", "peak_bytes")
        differ = [r for rank, ranks in positions for r in ranks if any(built[r][k] != built[rank][k] for k in keys)]
        checked = {"ranks": len(built), "differ": differ}
    any_rep = next(iter(built.values()))
    return {
        "world": world,
        "spec": any_rep["spec"],
        "mesh": any_rep["mesh"],
        "shape": shape,
        "facts": facts,
        "positions": out_positions,
        "seconds": {"imports": t1 - t0, "build": t2 - t1, "positions": t3 - t2},
        "processes": len(built),
        "checked": checked,
    }


def _reps(results: dict[int, dict], shape, names) -> set[int]:
    """One rank per stage among ``results`` whose signatures define the grouping (the lowest)."""
    best: dict[int, int] = {}
    for r in results:
        s = _stage_of(r, shape, names)
        best[s] = min(best.get(s, r), r)
    return set(best.values())


def main() -> None:
    import cloudpickle

    request = cloudpickle.loads(sys.stdin.buffer.read())
    try:
        result = dry_run(request)
    except BaseException as exc:  # noqa: BLE001  (the notebook shows it)
        result = {"error": f"{type(exc).__name__}: {_one_line(exc)}", "detail": traceback.format_exc()}
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
