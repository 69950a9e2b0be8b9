"""Checkpoints on real gloo ranks (shared sets, nothing killed): reshard, magics, safety, retention.

Kill / restart drills are in ``test_failures.py`` (private rank sets).
"""

from __future__ import annotations

import pytest
from checkpoint_cells import CLEAN, build_cell

from workbench.notebook import checkpoints as ck
from workbench.notebook.cluster import RankFailure
from workbench.shared.checkpoint import catalog

LIVE = """
import torch
_ck_x = torch.arange(16).view(1, 16) % _ck_model.cfg.vocab
_ck_live = {n: p.detach().full_tensor() if hasattr(p, "full_tensor") else p.detach().clone()
            for n, p in _ck_model.named_parameters()}
with torch.no_grad():
    _ck_logits = _ck_model.eval()(_ck_x)
_ck_logits = _ck_logits.full_tensor() if hasattr(_ck_logits, "full_tensor") else _ck_logits
_ck_model.train()
"""


def assert_export_is_the_model(tensors: dict, live: dict, logits):
    """Every exported tensor equals the live model's parameter (full shape, same values), and a
    fresh GPT given the export computes the live model's logits."""
    import torch

    from workbench.models import GPT, GPTConfig

    assert sorted(tensors) == sorted(live)
    for name, value in live.items():
        assert tensors[name].shape == value.shape and torch.equal(tensors[name], value), name
    fresh = GPT(GPTConfig.tiny())
    missing, unexpected = fresh.load_state_dict(tensors, strict=False)
    assert not unexpected and all(n not in dict(fresh.named_parameters()) for n in missing), (missing, unexpected)
    with torch.no_grad():
        got = fresh.eval()(torch.arange(16).view(1, 16) % fresh.cfg.vocab)
    assert torch.allclose(got, logits, rtol=1e-5, atol=1e-6)


def build(rs, spec="ddp", cfg="", opt="AdamW"):
    rs.execute(build_cell(spec, cfg, opt), timeout=120)


@pytest.fixture
def clean4(ranks4):
    yield ranks4
    ranks4.execute(CLEAN, timeout=60)


@pytest.fixture
def clean2(ranks2):
    yield ranks2
    ranks2.execute(CLEAN, timeout=60)


def close(a, b, rel=1e-5):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def test_fsdp2_on_4_ranks_loads_into_ddp_on_2_with_equal_loss(clean4, clean2, tmp_path):
    root = str(tmp_path)
    build(clean4, "fsdp2")
    clean4.execute("_ck_train(3)", timeout=120)
    info = ck.save(root=root, rankset=clean4)
    assert info["name"] == "step-00000003" and info["step"] == 3
    clean4.execute("_ck_train(2)", timeout=120)
    ref = clean4.pull("_ck_losses")[0]
    build(clean2, "ddp")
    loaded = ck.load("latest", root=root, rankset=clean2)
    assert (loaded["from_strategy"], loaded["from_world_size"], loaded["world_size"]) == ("fsdp2", 4, 2)
    assert clean2.pull("_ck_state.step") == [3, 3]
    clean2.execute("_ck_train(2)", timeout=120)
    got = clean2.pull("_ck_losses")[0]
    assert sorted(got) == [3, 4]
    for s in (3, 4):  # step 3: the restored weights; step 4: also the restored AdamW state
        assert close(got[s], ref[s]), (s, got[s], ref[s])
    df = ck.list(root)
    row = df.iloc[-1]
    assert (row["step"], row["world_size"], row["strategy"], bool(row["latest"])) == (3, 4, "fsdp2", True)
    assert row["size_mb"] > 0 and abs(row["loss"] - ref[2]) < 1e-6


def test_magics_async_save_list_load_export_delete(shell, clean4, tmp_path):
    shell.run_line_magic("distrain", f"ckpt dir {tmp_path}")
    build(clean4, "ddp")
    clean4.execute("_ck_train(2)", timeout=60)
    shell.run_line_magic("distrain", "ckpt save --async")
    clean4.execute("_ck_train(1)", timeout=60)  # trains while (or after) the save is written
    shell.run_line_magic("distrain", "ckpt wait")
    shell.run_line_magic("distrain", "ckpt save --tag three")
    clean4.execute("_ck_train(2)", timeout=60)
    ref = clean4.pull("_ck_losses")[0]
    df = shell.run_line_magic("distrain", "ckpt list")
    assert list(df["name"]) == ["step-00000002", "three"] and list(df["step"]) == [2, 3]
    assert {"step", "time", "world_size", "strategy", "loss", "size_mb"} <= set(df.columns)
    shell.run_line_magic("distrain", "ckpt load 2")
    assert clean4.pull("_ck_state.step") == [2] * 4
    clean4.execute("_ck_losses.clear(); _ck_train(3)", timeout=60)
    got = clean4.pull("_ck_losses")[0]
    assert all(close(got[s], ref[s]) for s in (2, 3, 4)), (got, ref)  # async save held step 2 exactly
    out = tmp_path / "export" / "model.safetensors"
    shell.run_line_magic("distrain", f"ckpt export {out} three")
    from safetensors.torch import load_file

    tensors = load_file(str(out))
    names = (
        clean4.execute("_ck_names = sorted(n for n, _ in _ck_model.named_parameters())") and clean4.pull("_ck_names")[0]
    )
    assert sorted(tensors) == names
    # by value: the export of "three" is the model as "three" loads it back on the ranks, and a
    # fresh model given the exported tensors computes the same logits as the live one
    shell.run_line_magic("distrain", "ckpt load three")
    clean4.execute(LIVE, timeout=60)
    live, logits = clean4.pull("_ck_live")[0], clean4.pull("_ck_logits")[0]
    assert_export_is_the_model(tensors, live, logits)
    shell.run_line_magic("distrain", "ckpt delete three")
    assert list(ck.list(str(tmp_path))["name"]) == ["step-00000002"]
    catalog.set_default_dir("checkpoints")


def test_export_of_a_sharded_fsdp2_checkpoint_is_the_model_by_value(clean2, tmp_path):
    """An FSDP2 checkpoint (each rank holds a shard) exports full tensors equal to the
    gathered live parameters; a fresh model on them gives the live logits."""
    build(clean2, "fsdp2")
    clean2.execute("_ck_train(2)", timeout=120)
    ck.save(root=str(tmp_path), rankset=clean2)
    out = tmp_path / "model.safetensors"
    ck.export(str(out), root=str(tmp_path), rankset=clean2)
    clean2.execute(LIVE, timeout=60)
    from safetensors.torch import load_file

    assert_export_is_the_model(load_file(str(out)), clean2.pull("_ck_live")[0], clean2.pull("_ck_logits")[0])


def test_incompatible_model_is_refused_naming_the_tensors(clean2, tmp_path):
    root = str(tmp_path)
    build(clean2, "ddp")
    clean2.execute("_ck_train(1)", timeout=60)
    ck.save(root=root, rankset=clean2)
    build(clean2, "ddp", cfg="ffn_dim=48")
    with pytest.raises(RankFailure) as err:
        ck.load(root=root, rankset=clean2)
    msg = str(err.value)
    assert "IncompatibleCheckpoint" in msg and "layers.0.feed_forward" in msg and "(64, 32)" in msg.replace("[", "(")
    assert clean2.pull("_ck_state.step") == [0, 0]  # nothing was loaded
    build(clean2, "ddp", opt="SGD")
    with pytest.raises(RankFailure) as err:
        ck.load(root=root, rankset=clean2)
    assert "optimizer" in str(err.value) and "--model-only" in str(err.value)
    info = ck.load(root=root, model_only=True, rankset=clean2)
    assert info["model_only"] and clean2.pull("_ck_state.step") == [1, 1]


def test_async_saves_in_a_row_each_hold_their_own_step(clean2, tmp_path):
    """Async FSDP2 saves reuse their staging buffers (and DCP's cached plan while the tensors
    stay the same): three saves with training between them, the middle one model-only, each
    load back the parameters of their own step, never those of a later or an earlier one; then
    a model of other shapes on the same ranks: its async save writes (and loads) its own shapes."""
    root = str(tmp_path)
    build(clean2, "fsdp2")
    want = {}
    for step in (1, 2, 3):
        clean2.execute("_ck_train(1); _ck_d = _ck_digest()", timeout=120)
        want[step] = clean2.pull("_ck_d")[0]
        ck.save(tag=f"s{step}", async_=True, root=root, with_optimizer=step != 2, rankset=clean2)
    clean2.execute("_ck_train(1)", timeout=120)  # the third save is written while this step runs
    ck.wait(rankset=clean2)
    assert len({str(sorted(d.items())) for d in want.values()}) == 3  # each step changed the weights
    for step in (3, 1, 2):
        ck.load(f"s{step}", root=root, model_only=step == 2, rankset=clean2)
        clean2.execute("_ck_d = _ck_digest()", timeout=60)
        assert clean2.pull("_ck_d") == [want[step]] * 2, step
    build(clean2, "fsdp2", cfg="ffn_dim=48")
    clean2.execute("_ck_train(1); _ck_d = _ck_digest()", timeout=120)
    wider = clean2.pull("_ck_d")[0]
    ck.save(tag="s4", async_=True, root=root, rankset=clean2)
    ck.wait(rankset=clean2)
    clean2.execute("_ck_train(1)", timeout=120)
    ck.load("s4", root=root, rankset=clean2)
    clean2.execute("_ck_d = _ck_digest()", timeout=60)
    assert clean2.pull("_ck_d") == [wider] * 2


OLD_WRITER = """
from torch.distributed.checkpoint import FileSystemWriter
from workbench.engine.checkpoint import shard_writer as _ck_sw
_ck_sw_writer = _ck_sw.writer
_ck_sw.writer = lambda path: FileSystemWriter(path, single_file_per_rank=True, sync_files=True, thread_count=1)
"""


def test_shards_load_with_stock_dcp_and_older_zip_shards_still_load(clean2, tmp_path):
    """Shards are written in torch.save's legacy format, header and bytes (no torch.save a tensor):
    DCP's stock reader, outside the workbench, reads every parameter back equal; a checkpoint
    whose shards DCP wrote with zip ``torch.save`` (every one saved before) loads back its own
    step, as a new one does."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    root = str(tmp_path)
    build(clean2, "fsdp2")
    clean2.execute("_ck_train(1); _ck_d = _ck_digest()", timeout=120)
    want = clean2.pull("_ck_d")[0]
    clean2.execute(LIVE, timeout=60)
    live = clean2.pull("_ck_live")[0]
    clean2.execute(OLD_WRITER, timeout=60)
    try:
        ck.save(tag="old", root=root, rankset=clean2)
    finally:
        clean2.execute("_ck_sw.writer = _ck_sw_writer", timeout=60)
    ck.save(tag="new", root=root, async_=True, rankset=clean2)
    ck.wait(rankset=clean2)
    for tag, zipped in (("old", True), ("new", False)):
        with open(f"{root}/{tag}/__0_0.distcp", "rb") as fh:  # zip torch.save files start "PK"
            assert (fh.read(2) == b"PK") == zipped, tag
    dcp_to_torch_save(f"{root}/new", str(tmp_path / "new.pt"))
    flat = torch.load(tmp_path / "new.pt", weights_only=True)
    params = flat["model"]
    assert sorted(params) == sorted(live)
    for name, value in live.items():
        assert torch.equal(params[name], value), name
    for tag in ("old", "new"):
        clean2.execute("_ck_train(2)", timeout=120)
        ck.load(tag, root=root, rankset=clean2)
        clean2.execute("_ck_d = _ck_digest()", timeout=60)
        assert clean2.pull("_ck_d") == [want] * 2, tag
