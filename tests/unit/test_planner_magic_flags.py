"""`%distrain plan` with the planner's new inputs, through a real IPython shell (no ranks:
planning with arguments is arithmetic in the kernel)."""

from __future__ import annotations

import pytest


@pytest.fixture
def ip(ipshell):
    return ipshell


def test_plan_magic_reports_the_new_inputs_term_by_term(ip, capsys):
    r = ip.run_cell(
        "%distrain plan --model 405b --hw h100 --gpus 16384 --tp 8 --pp 16 "
        "--dp 128 --zero 2 -m 16 --schedule interleaved --virtual-stages 8 "
        "--stages balanced --fp8 --attention eager"
    )
    assert r.success, r.error_in_exec
    out = capsys.readouterr().out
    for needle in (
        "layers per pipeline rank: 7, 8 x 14, 7",
        "[fp8]  attention: eager",
        # the Llama block's saved tensors, the four linear inputs halved in fp8, and the
        # softmax output of the eager kernel (no dropout: 2as/h, not the paper's 5as/h)
        "25.5sbh/t = norm inputs 4 + attention input 1 + Q 2 + K, V 0.25 + attention output 1",
        "linear inputs in fp8; + 2as/h scores stored (eager)",
        "x 128 layers in flight",
        "in flight: interleaved, 16 micro-batches x 8 chunks (8 layers)",
        "fp8 weights",
        "(at the fp8 peak) + attention",
        "at the bf16 peak",
        "x 1.011 busiest stage over the mean",
        "bubble: 11.5% of compute",
        "published convention",
        "DOES NOT FIT",
    ):
        assert needle in out, (needle, out)


def test_plan_magic_says_why_the_llama3_405b_run_fits(ip, capsys):
    """Grattafiori et al. 2024 ("The Llama 3 Herd of Models"), Table 4, 16K-GPU row, as a
    user types it: fits, and every memory term is printed with where it comes from."""
    r = ip.run_cell(
        "%distrain plan --model 405b --hw h100 --gpus 16384 --tp 8 --pp 16 "
        "--dp 128 --zero 2 -m 16 --schedule interleaved --virtual-stages 8 --stages balanced"
    )
    assert r.success, r.error_in_exec
    out = capsys.readouterr().out
    for needle in (
        "memory per GPU (stage 1): 74.9 GB of 80 GiB (90% usable = 77.3 GB) -> fits",
        "parameters      6.4 GB = 2 B/param, not sharded (ZeRO-2) x 3.19B params (this rank's, before ZeRO)",
        "gradients      49.8 MB = 2 B/param / 128 ZeRO-2",
        "optimizer     298.9 MB = 12 B/param / 128 ZeRO-2",
        "activations    68.2 GB = 532.7 MB/layer x 128 layers in flight",
        "31.75sbh/t = norm inputs 4 + attention input 2 + Q 2 + K, V 0.25 + attention output 2 "
        "+ MLP input 2 + gate, up 13 + down input 6.5; no s x s scores (flash)",
        "every forward before the first backward when m = p",
        "bubble: 11.5% of compute",
        "MFU: 42.9%",
    ):
        assert needle in out, (needle, out)
    assert "warning" not in out, out


@pytest.mark.parametrize(
    "argv, message",
    [
        ("--model 70b --hw h100 --fp8 --precision bf16", "--fp8 and --precision bf16 disagree"),
        ("--model 70b --hw h100 --stages 40,40", "give --pp N"),
        ("--model 70b --hw h100 --attention xformers", "invalid choice: 'xformers'"),
        ("--model 70b --hw h100 --cp 3", "cp=3 does not divide seq_len"),
    ],
)
def test_plan_magic_refuses_bad_new_flags(ip, capsys, argv, message):
    r = ip.run_cell(f"%distrain plan {argv}")
    text = capsys.readouterr()
    shown = str(r.error_in_exec or "") + text.out + text.err
    assert not r.success
    assert message in shown, shown
