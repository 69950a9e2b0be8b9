"""The report of a dry run: per position, what its rank holds and peaks at, beside the planner.

``table()`` one row per distinct rank position, ``compare()`` the planner's terms beside it
(:mod:`workbench.planner.side_by_side`), ``collectives()`` one step's collectives by group,
``stages()`` the pipeline's balance, ``figure()`` memory per position beside the planner's
bars, ``against()`` live ranks' measured steps beside their positions. Notebook side: pandas
and plotly."""

from __future__ import annotations

import math

from ..planner.memory import fmt_bytes
from ..shared.dry_run import DryRunRequest, DryRunResult
from ..shared.ranges import format_ranks

__all__ = ["DryRun"]

GIB = 2**30


def _dims_of(ranks: list[int], shape: list[int], names: list[str]) -> str:
    """The mesh dimensions a group of ranks spans (``tp``, ``dp_shard``, ``pp``, ``dp_shard x tp``)."""

    def coords(r: int) -> list[int]:
        out = []
        for size in reversed(shape):
            out.append(r % size)
            r //= size
        return out[::-1]

    cs = [coords(r) for r in ranks]
    spans = [n for i, n in enumerate(names) if len({c[i] for c in cs}) > 1]
    return " x ".join(spans) or "self"


class DryRun:
    """A dry run's report (see the module doc); ``.result`` is the raw :class:`DryRunResult`."""

    def __init__(self, result: DryRunResult, *, request: DryRunRequest, hardware: str = "h100", catalogue=None):
        self.result = result
        self.request = request
        self.hardware = hardware
        self.catalogue = catalogue
        self.model = None
        self.layout = None
        self.planner_note = ""
        self._plan()

    # ------------------------------------------------------------------ the planner's side
    def _plan(self) -> None:
        from ..planner.side_by_side import planner_layout, planner_model

        r = self.result
        if r.shape is None:
            self.planner_note = "the model has no shape the planner reads (a transformers config or a GPTConfig)"
            return
        stages: dict[int, int] = {}
        for p in r.positions:
            stages[p.stage] = len(p.blocks)
        counts = tuple(stages[s] for s in sorted(stages))
        try:
            self.model = planner_model(r.shape, r.facts.get("implementation", "megatron"))
            self.layout = planner_layout(
                r.spec, r.world, batch=self.request.batch, facts=r.facts, stages=counts if len(counts) > 1 else None
            )
            self.layout.validate_for(self.model)
        except ValueError as exc:
            self.model = self.layout = None
            self.planner_note = f"no planner side: {exc}"

    # ------------------------------------------------------------------ tables
    def table(self):
        """One row per distinct rank position: the ranks it stands for and its rank's bytes."""
        import pandas as pd

        m = self.result.mesh
        rows = []
        for p in self.result.positions:
            rows.append(
                {
                    "position": p.position,
                    "ranks": format_ranks(list(p.ranks)),
                    "n_ranks": len(p.ranks),
                    "grouped_over": _dims_of(list(p.ranks), m["shape"], m["dim_names"]),
                    "rank": p.rank,
                    "stage": p.stage,
                    "blocks": len(p.blocks),
                    "param_bytes": p.param_bytes,
                    "grad_bytes": p.grad_bytes,
                    "optim_bytes": p.optim_bytes,
                    "saved_bytes": p.activation_bytes,
                    "peak_bytes": p.peak_bytes,
                    "comm_bytes": sum(c["bytes"] for c in p.collectives),
                }
            )
        return pd.DataFrame(rows)

    def compare(self):
        """The planner's terms beside the dry run's, per position (empty when the planner has
        no side: ``.planner_note`` says why). Columns: position, stage, term, dry_run_bytes,
        planner_bytes, paper_bytes, ratio, flagged, source, why."""
        import pandas as pd

        from ..planner.side_by_side import compare_rows

        cols = [
            "position",
            "stage",
            "term",
            "dry_run_bytes",
            "planner_bytes",
            "paper_bytes",
            "ratio",
            "flagged",
            "source",
            "why",
        ]
        if self.model is None:
            return pd.DataFrame(columns=cols)
        rows = []
        for p in self.result.positions:
            for row in compare_rows(p.to_dict(), self.model, self.layout):
                rows.append({"position": p.position, "stage": p.stage, **row})
        return pd.DataFrame(rows, columns=cols)

    def collectives(self):
        """What one step issues on each position's rank: op, the mesh dims of its group, the
        group's size, how many times, and the bytes of the buffers handed to it."""
        import pandas as pd

        m = self.result.mesh
        rows = [
            {
                "position": p.position,
                "op": c["op"],
                "group": _dims_of(c["ranks"], m["shape"], m["dim_names"]),
                "group_size": len(c["ranks"]),
                "count": c["count"],
                "bytes": c["bytes"],
            }
            for p in self.result.positions
            for c in p.collectives
        ]
        return pd.DataFrame(rows, columns=["position", "op", "group", "group_size", "count", "bytes"])

    def stages(self):
        """The pipeline stages' balance: blocks, parameter bytes and peak of each stage's
        heaviest position, and each against the mean over stages."""
        import pandas as pd

        best: dict[int, object] = {}
        for p in self.result.positions:
            if p.stage not in best or p.peak_bytes > best[p.stage].peak_bytes:
                best[p.stage] = p
        rows = [
            {"stage": s, "blocks": len(p.blocks), "param_bytes": p.param_bytes, "peak_bytes": p.peak_bytes}
            for s, p in sorted(best.items())
        ]
        df = pd.DataFrame(rows)
        for col in ("blocks", "param_bytes", "peak_bytes"):
            mean = df[col].mean()
            df[f"{col}_vs_mean"] = df[col] / mean if mean else math.nan
        return df

    def against(self, measured: list[dict]):
        """The dry run beside live ranks' steps (:func:`workbench.engine.step_peak.measure_step`
        dicts, one per rank): per rank, its position's bytes and the rank's, and their ratios."""
        import pandas as pd

        by_rank = {r: p for p in self.result.positions for r in p.ranks}
        rows = []
        for m in sorted(measured, key=lambda d: d["rank"]):
            p = by_rank[m["rank"]]
            row = {"rank": m["rank"], "position": p.position}
            for key in ("param_bytes", "grad_bytes", "optim_bytes", "peak_bytes"):
                dry = getattr(p, key)
                row[f"dry_{key}"] = dry
                row[f"live_{key}"] = m[key]
            row["peak_ratio"] = p.peak_bytes / m["peak_bytes"]
            rows.append(row)
        return pd.DataFrame(rows)

    # ------------------------------------------------------------------ text and picture
    def summary(self) -> str:
        r = self.result
        pos = r.positions
        lines = [
            f"dry run: {r.spec['kind']} on {r.world} ranks, mesh "
            + " x ".join(f"{n}={k}" for n, k in zip(r.mesh["dim_names"], r.mesh["shape"]))
            + f"; {len(pos)} distinct position(s) built in {r.processes} process(es), "
            f"{sum(r.seconds.values()):.1f} s",
        ]
        for p in pos:
            lines.append(
                f"  position {p.position} (stage {p.stage}, ranks {format_ranks(list(p.ranks))}): "
                f"params {fmt_bytes(p.param_bytes)}, grads {fmt_bytes(p.grad_bytes)}, optimizer "
                f"{fmt_bytes(p.optim_bytes)}, peak {fmt_bytes(p.peak_bytes)}"
            )
        if r.checked:
            differ = r.checked.get("differ", [])
            lines.append(
                f"every rank built ({r.checked['ranks']}): "
                + (
                    "each equals its position"
                    if not differ
                    else f"ranks {format_ranks(differ)} differ from their position"
                )
            )
        cmp = self.compare()
        if self.model is None:
            lines.append(self.planner_note)
        else:
            flagged = cmp[cmp["flagged"]]
            lines.append(
                f"beside the planner ({self.layout.describe()}): {len(flagged)} of {len(cmp)} terms differ by more than 5%"
            )
            for _, row in flagged.head(8).iterrows():
                ratio = "-" if row["ratio"] is None or row["ratio"] != row["ratio"] else f"{row['ratio']:.2f}"
                lines.append(
                    f"  position {row['position']} {row['term']}: dry run {fmt_bytes(row['dry_run_bytes'])}, "
                    f"planner {fmt_bytes(row['planner_bytes'])} (x{ratio}; {row['source'][:80]})"
                )
        return "\n".join(lines)

    def figure(self):
        """Memory per position: the dry run's bars (parameters, gradients, optimizer state,
        the rest of the peak) beside the planner's (its terms up to its peak)."""
        from .dashboard.dry_run_figure import dry_run_figure

        return dry_run_figure(self)

    def __repr__(self) -> str:
        return self.summary()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        print(self.summary())
        try:
            display(self.figure())
        except Exception as exc:  # noqa: BLE001  (the text above stands on its own)
            print(f"(no figure: {exc})")
