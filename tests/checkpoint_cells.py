"""Cells that build a tiny GPT under a strategy on the ranks and train it with checkpoint
tracking, for the checkpoint tests (tests/ranks/test_checkpoint.py, tests/cluster/test_ssh.py).

Everything they leave on the ranks is named ``_ck_*`` and removed by :data:`CLEAN`:
``_ck_model``, ``_ck_prep``, ``_ck_state`` (the tracked step), ``_ck_losses`` (step -> loss),
``_ck_train(n)`` (n more steps) and ``_ck_digest()`` (parameter name -> sha256 of the whole
tensor: a collective for sharded parameters).
"""

from __future__ import annotations

_BUILD = """
import hashlib, torch
from workbench.models import GPT, GPTConfig, SyntheticDataset, batch_at
from workbench.strategies import prepare
from workbench.engine import checkpoint_hooks as ch
torch.manual_seed(0)
_ck_model = GPT(GPTConfig.tiny({cfg}))
_ck_prep = prepare(_ck_model, lambda ps: torch.optim.{opt}(ps, lr=1e-2), {spec!r})
_ck_state = ch.track(_ck_prep)
_ck_ds = SyntheticDataset("copy", n=256, seq_len=16)
_ck_losses = {{}}
def _ck_train(n):
    for _ in range(n):
        s = _ck_state.step
        _ck_losses[s] = _ck_prep.train_step(batch_at(_ck_ds, 8, s, dp_rank=_ck_prep.dp_rank, dp_size=_ck_prep.dp_size))
        ch.step_done(_ck_losses[s])
def _ck_digest():
    out = {{}}
    for n, p in _ck_model.named_parameters():
        t = p.detach().full_tensor() if hasattr(p, "full_tensor") else p.detach()
        out[n] = hashlib.sha256(t.float().contiguous().numpy().tobytes()).hexdigest()
    return out
"""


def build_cell(spec: str = "ddp", cfg: str = "", opt: str = "AdamW") -> str:
    """The cell that builds the model under ``spec`` (``cfg``: GPTConfig.tiny's arguments,
    ``opt``: a torch.optim class name)."""
    return _BUILD.format(spec=spec, cfg=cfg, opt=opt)


# also ends a pending save and any save drill, and stops tracking and auto-save
CLEAN = """
from workbench.engine import checkpoint_hooks as ch
from workbench.engine.checkpoint import save as _ck_save
_ck_save.wait(); _ck_save.DRILL['after_parts'] = 0.0
ch.untrack(); ch.set_autosave(None, None)
for _n in [n for n in list(globals()) if n.startswith('_ck_')]:
    del globals()[_n]
"""
