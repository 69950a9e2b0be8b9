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
        "[sbh(34 + 5as/h), scores stored (eager), linear inputs in fp8 (34 -> 27)]",
        "layers in flight (interleaved)",
        "fp8 weights",
        "(at the fp8 peak) + attention",
        "at the bf16 peak",
        "x 1.011 busiest stage over the mean",
        "bubble: 11.5% of compute",
        "published convention",
        "DOES NOT FIT",
    ):
        assert needle in out, (needle, out)


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
