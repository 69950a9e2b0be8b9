"""The trainer on a user's model and data (real gloo ranks, the shared 2-rank set).

Batches ``(x, y)``, dicts passed as ``model(**batch)`` (a tiny random-init Hugging Face
Llama computing its own loss), a ``step_fn``; data as a function, an iterable, a one-shot
iterator, a ``Dataset`` sharded by the trainer, a ``DataLoader``; the data position saved
and restored by checkpoints; a batch of an unknown shape refused with one message.
"""

from __future__ import annotations

import pytest
from conftest import clean_trainer

from workbench.notebook import checkpoints as ck
from workbench.notebook import training

LLAMA = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM
_td_cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
torch.manual_seed(0)
_td_hf = LlamaForCausalLM(_td_cfg)
_td_init = {k: v.clone() for k, v in _td_hf.state_dict().items()}

class _TdTokens(torch.utils.data.Dataset):
    # 32 sequences of 12 tokens; labels are the inputs (the model shifts them)
    def __init__(self):
        self.ids = torch.randint(0, 64, (32, 12), generator=torch.Generator().manual_seed(1))
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}
_td_ds = _TdTokens()
"""

TOY = """
import torch
from workbench import engine

class _TdIndexed(torch.utils.data.Dataset):
    # sample i: features and its own index, so the tests see which samples a rank took
    def __len__(self):
        return 16
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(4, generator=g), "idx": i}

_td_seen = {}
def _td_step(model, batch):
    import workbench.engine.trainer as _tr
    _td_seen.setdefault(_tr.current().step + 1, []).extend(batch["idx"].tolist())
    return model(batch["x"]).pow(2).mean()

torch.manual_seed(0)
_td_prep = engine.prepare(torch.nn.Linear(4, 1), lambda ps: torch.optim.SGD(ps, lr=0.1), "ddp")
"""


@pytest.fixture
def rs(ranks2):
    yield ranks2
    ranks2.apply(clean_trainer, timeout=60)
    ranks2.execute(
        "for _n in [n for n in list(globals()) if n.startswith('_td_')]:\n    del globals()[_n]\n"
        "from workbench.engine import session as _s\n_s.clear()",
        timeout=60,
    )


def wait_done(rs, timeout=120):
    return rs.apply(lambda: __import__("workbench.engine.trainer", fromlist=["x"]).current().wait(timeout)["state"])


def test_dict_batches_on_an_hf_llama_match_a_hand_loop(rs):
    """ddp x 2 over a Dataset of {input_ids, labels}: the trainer's loss is outputs.loss averaged over
    the ranks, equal (fp32, 1e-5) to a 1-process loop over the same global batches."""
    rs.execute(LLAMA, timeout=180)
    rs.execute(
        """
from workbench import engine
_td_prep = engine.prepare(_td_hf, lambda ps: torch.optim.AdamW(ps, lr=1e-2), "ddp")
_td_t = engine.Trainer(_td_prep, data=_td_ds, batch_size=8, seed=3)
_td_losses = []
_td_t.add_hook(lambda r: _td_losses.append(r["loss"]), pauses=False)
_td_t.start(5)
_td_t.wait(120)
""",
        timeout=180,
    )
    assert rs.pull("_td_t.state") == ["finished"] * 2
    got = rs.pull("_td_losses")
    assert got[0] == got[1] and len(got[0]) == 5
    rs.execute(
        """
ref = LlamaForCausalLM(_td_cfg)
ref.load_state_dict(_td_init)
opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
_td_ref = []
for step in range(5):  # epoch e = randperm(32, seed 3 + e), cut into 4 global batches of 8
    epoch, j = divmod(step, 4)
    idx = torch.randperm(32, generator=torch.Generator().manual_seed(3 + epoch))[j * 8:(j + 1) * 8]
    out = ref(input_ids=_td_ds.ids[idx], labels=_td_ds.ids[idx])
    opt.zero_grad()
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
    opt.step()
    _td_ref.append(float(out.loss))
""",
        ranks=[0],
        timeout=120,
    )
    ref = rs.pull("_td_ref", ranks=[0])[0]
    for a, b in zip(got[0], ref):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (got[0], ref)
    assert ref[-1] < ref[0]


def test_step_fn_over_a_sharded_dataset_sees_each_sample_once_an_epoch_and_resumes(rs, tmp_path):
    rs.execute(
        TOY
        + """
_td_t = engine.Trainer(_td_prep, data=_TdIndexed(), batch_size=4, step_fn=_td_step)
_td_t.start(6)
_td_t.wait(120)
""",
        timeout=120,
    )
    seen = rs.pull("_td_seen")
    for s in range(1, 7):
        assert [len(r[s]) for r in seen] == [2, 2]
    epoch0 = [i for r in seen for s in range(1, 5) for i in r[s]]
    assert sorted(epoch0) == list(range(16))  # 4 global batches of 4: every sample once over the ranks
    epoch1 = [i for s in (5, 6) for r in seen for i in r[s]]
    assert len(set(epoch1)) == 8 and epoch1 != [i for s in (1, 2) for r in seen for i in r[s]]  # a new order

    root = str(tmp_path)
    info = ck.save(root=root, rankset=rs)  # at step 6 (epoch 1, batch 2)
    with pytest.raises(ValueError, match="keeps no Hugging Face config: the model saved was not a transformers"):
        ck.export(str(tmp_path / "hf"), root=root, hf=True, rankset=rs)
    rs.execute("_td_t.start(3); _td_t.wait(120)", timeout=120)
    after = rs.pull("_td_seen")
    ck.load(info["name"], root=root, rankset=rs)
    assert rs.pull("_td_t.data_state()")[0]["micro_batch"] == 6
    rs.execute("_td_seen.clear(); _td_t.start(3); _td_t.wait(120)", timeout=120)
    again = rs.pull("_td_seen")
    for r in (0, 1):  # the same samples on the same rank, in the same order, after the load
        assert {s: again[r][s] for s in (7, 8, 9)} == {s: after[r][s] for s in (7, 8, 9)}
    assert sorted(i for s in (5, 6, 7, 8) for r in after for i in r[s]) == list(range(16))


def test_dataloader_sharded_by_batches_and_resumed_at_the_sampler(rs, tmp_path):
    rs.execute(
        TOY
        + """
_td_loader = torch.utils.data.DataLoader(_TdIndexed(), batch_size=2, shuffle=True)
_td_t = engine.Trainer(_td_prep, data=_td_loader, step_fn=_td_step)
_td_t.start(5)
_td_t.wait(120)
""",
        timeout=120,
    )
    seen = rs.pull("_td_seen")
    assert sorted(i for r in seen for s in range(1, 5) for i in r[s]) == list(range(16))
    root = str(tmp_path)
    ck.save(root=root, rankset=rs)
    rs.execute("_td_t.start(4); _td_t.wait(120)", timeout=120)
    after = rs.pull("_td_seen")
    ck.load("latest", root=root, rankset=rs)
    rs.execute("_td_seen.clear(); _td_t.start(4); _td_t.wait(120)", timeout=120)
    again = rs.pull("_td_seen")
    for r in (0, 1):
        assert {s: again[r][s] for s in range(6, 10)} == {s: after[r][s] for s in range(6, 10)}
    assert sorted(i for s in range(5, 9) for r in after for i in r[s]) == list(range(16))


def test_iterables_pairs_and_a_one_shot_iterator_that_runs_out(rs):
    rs.execute(
        """
import torch
from workbench import engine
torch.manual_seed(0)
_td_prep = engine.prepare(torch.nn.Linear(4, 3), lambda ps: torch.optim.SGD(ps, lr=0.1), "ddp")
_td_batches = [(torch.randn(2, 4), torch.randint(0, 3, (2,))) for _ in range(3)]
_td_t = engine.Trainer(_td_prep, data=_td_batches, loss_fn=torch.nn.functional.cross_entropy)
_td_t.start(7)   # a list is re-iterated: 7 steps over 3 batches
_td_t.wait(120)
_td_gen = engine.Trainer(_td_prep, data=(b for b in _td_batches), loss_fn=torch.nn.functional.cross_entropy)
_td_gen.start(5)
_td_gen.wait(120)
""",
        timeout=120,
    )
    assert rs.pull("(_td_t.state, _td_t.step)") == [("finished", 7)] * 2
    assert rs.pull("_td_t.data_state()")[0] == {
        "kind": "iterable",
        "micro_batch": 7,
        "epoch": 2,
        "batch_in_epoch": 1,
        "grad_accum": 1,
    }
    state, step, reason = rs.pull("(_td_gen.state, _td_gen.step, _td_gen.reason)")[0]
    assert (state, step) == ("finished", 3) and "ran out after 3 batches" in reason


def test_a_batch_of_unknown_shape_is_refused_naming_it_and_the_ranks_stay_usable(rs):
    rs.execute(
        """
import torch
from workbench import engine
from workbench.engine import trainer as _tr
torch.manual_seed(0)
_td_prep = engine.prepare(torch.nn.Linear(4, 3), lambda ps: torch.optim.SGD(ps, lr=0.1), "ddp")
_td_before = _tr._CURRENT
""",
        timeout=120,
    )
    rs.execute(
        "try:\n    engine.Trainer(_td_prep, data=lambda i: (torch.randn(2, 4), torch.zeros(2), torch.ones(2)))\n"
        "    _td_err = None\nexcept Exception as e:\n    _td_err = f'{type(e).__name__}: {e}'",
        timeout=60,
    )
    errs = rs.pull("_td_err")  # caught on the ranks: an execute's error can lose the race to its reply
    assert errs[0].startswith("BadBatch: rank 0: ") and errs[1].startswith("BadBatch: rank 1: ")
    text = errs[0]
    assert "tuple of 3 (Tensor[2, 4] float32, Tensor[2] float32, Tensor[2] float32)" in text
    assert "(x, y)" in text and "model(**batch)" in text and "step_fn=(model, batch) -> loss" in text
    assert rs.pull("_tr._CURRENT is _td_before") == [True, True]  # no trainer was made
    # a Dataset without a batch size, or one the data-parallel ranks cannot share: said at once
    rs.execute(
        "_td_ds = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randint(0, 3, (8,)))\n_td_errs = []\n"
        "for kw in ({}, {'batch_size': 3}):\n    try:\n        engine.Trainer(_td_prep, data=_td_ds, **kw)\n"
        "    except ValueError as e:\n        _td_errs.append(str(e))",
        timeout=60,
    )
    no_size, odd = rs.pull("_td_errs")[0]
    assert (
        "data is a TensorDataset (a Dataset): give batch_size= (the global micro-batch over the 2 data-parallel "
        "ranks), e.g. Trainer(..., data=ds, batch_size=16)" == no_size
    )
    assert odd.startswith("batch_size=3 (the global micro-batch) must divide by the 2 data-parallel ranks")
    # a dict without labels: the model gives no loss; said at the first step, the run ends in error
    rs.execute(
        """
class _TdNoLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
    def forward(self, x):
        return self.lin(x)
_td_p2 = engine.prepare(_TdNoLoss(), lambda ps: torch.optim.SGD(ps, lr=0.1), "ddp")
_td_t = engine.Trainer(_td_p2, data=lambda i: {"x": torch.randn(2, 4)})
_td_t.start(2)
_td_t.wait(60)
""",
        timeout=120,
    )
    state, reason = rs.pull("(_td_t.state, _td_t.reason)")[0]
    assert state == "error" and "with no loss for the batch dict {'x': Tensor[2, 4] float32}" in reason
    assert "put labels in the batch" in reason and "loss_fn=(outputs, batch) -> loss" in reason
    # the same model with a loss_fn on (outputs, batch) trains
    rs.execute(
        """
_td_t = engine.Trainer(_td_p2, data=lambda i: {"x": torch.randn(2, 4)}, loss_fn=lambda out, b: out.pow(2).mean())
_td_t.start(2)
_td_t.wait(60)
""",
        timeout=120,
    )
    assert rs.pull("(_td_t.state, _td_t.step)") == [("finished", 2)] * 2


def test_train_start_magic_picks_up_a_user_built_trainer(rs):
    """The documented path: build in a cell, engine.Trainer(...), then `train start` from the notebook."""

    from workbench.notebook import session

    previous = session.using(rs)
    previous.__enter__()
    try:
        rs.execute(
            TOY + "_td_t = engine.Trainer(_td_prep, data=_TdIndexed(), batch_size=4, step_fn=_td_step)", timeout=120
        )
        run = training.start(3, rankset=rs)
        assert training.wait(timeout=120, rankset=rs) == {0: "finished", 1: "finished"}
        assert rs.pull("(_td_t.run, _td_t.step)") == [(run, 3)] * 2
    finally:
        previous.__exit__()
