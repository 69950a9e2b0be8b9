"""Gradients arrive in their parameters' placements, with the one-process values.

DTensor's backward gives a vocab-parallel embedding (weight ``Shard(0)`` over tp) a
``Replicate()`` gradient, the full ``[vocab, dim]`` on every tp rank, and a sequence-
parallel norm a ``Partial(sum)`` one; without FSDP2 to redistribute them, stage 0 of
``pp=2 tp=2`` held 1.47x the gradient bytes the planner predicts (lab 10). Here, on real
gloo ranks, under ``pp=2 tp=2`` (4 ranks) and ``tp=2`` (2 ranks): every parameter's
gradient has its parameter's placements and local shape, equals the one-process gradient
of the same batch within 1e-5, and two steps give the one-process losses.
"""

from __future__ import annotations

import grad_ranks as G

TOL = 1e-5


def _check(rows_per_rank, spec):
    for rank, r in enumerate(rows_per_rank):
        assert r["rows"], (spec, rank)
        for name, row in r["rows"].items():
            tag = f"{spec} rank {rank} {name}"
            assert row["grad"] == row["param"], (tag, row)
            assert row["grad_local"] == row["param_local"], (tag, row)
            assert row["err"] <= TOL, (tag, row["err"])
        assert all(abs(a - b) <= TOL * abs(b) for a, b in zip(r["losses"], r["want"])), (spec, r["losses"], r["want"])
        assert r["want"][-1] < r["want"][0]
        assert any("gradient arrives in its parameter's placements" in n for n in r["notes"]), r["notes"]


def test_pp2_tp2_gradients_keep_placements_and_match_one_process(ranks4):
    rows = ranks4.apply(G.grad_report, "pp=2 tp=2")
    _check(rows, "pp=2 tp=2")
    # the vocab-parallel embedding lives on stage 0 (ranks 0, 1), sharded by vocab
    for rank in (0, 1):
        emb = rows[rank]["rows"]["tok_embeddings.weight"]
        assert emb["grad"] == ["S(0)"] and emb["grad_local"][0] * 2 == G.C.L.VOCAB
    assert "tok_embeddings.weight" not in rows[2]["rows"]


def test_tp2_gradients_keep_placements_and_match_one_process(ranks2):
    _check(ranks2.apply(G.grad_report, "tp=2"), "tp=2")
