"""Checkpoint safety and bookkeeping in one process (world size 1, no ranks needed).

A tampered ``.metadata`` (a pickle that would run code) and pickled non-tensor entries
are refused before anything is unpickled; auto-save retention; list/resolve/delete;
export to one safetensors file; an interrupted save is invisible.
"""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from workbench.engine import checkpoint_hooks as ch
from workbench.engine.checkpoint import save as ck_save
from workbench.engine.checkpoint.export import export_safetensors
from workbench.engine.checkpoint.load import load
from workbench.engine.checkpoint.safety import IncompatibleCheckpoint, UnsafeCheckpoint
from workbench.engine.checkpoint.state import Target, TrainState
from workbench.shared.checkpoint import catalog
from workbench.shared.checkpoint.integrity import DamagedCheckpoint
from workbench.shared.checkpoint.manifest import MANIFEST


def make(seed=0, hidden=8):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return Target(model=model, optimizer=opt, state=TrainState(), strategy="none")


def step(t: Target, i: int) -> float:
    g = torch.Generator().manual_seed(i)
    x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
    t.optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(t.model(x), y)
    loss.backward()
    t.optimizer.step()
    t.state.step += 1
    t.state.loss = float(loss.detach())
    return t.state.loss


def reseal(folder: str) -> None:
    """Record the folder's current files in its manifest, as an attacker who edits both would."""
    import json

    from workbench.shared.checkpoint import integrity

    path = os.path.join(folder, MANIFEST)
    m = json.load(open(path))
    m["integrity"] = {n: integrity.record(os.path.join(folder, n)) for n in os.listdir(folder) if n != MANIFEST}
    m["files"] = {n: v[0] for n, v in m["integrity"].items()}
    json.dump(m, open(path, "w"))


class Boom:
    def __reduce__(self):
        return (os.system, ("touch BOOM_MARKER",))


def test_world_size_1_roundtrip_restores_step_rng_and_optimizer(tmp_path):
    t = make()
    for i in range(3):
        step(t, i)
    t.state.data = {"micro_batch": 3}
    info = ck_save.save(t, str(tmp_path))
    assert info["name"] == "step-00000003"
    ref = [step(t, i) for i in (3, 4)]
    r_ref = torch.rand(3)
    u = make(seed=1)
    folder, m = catalog.resolve(str(tmp_path), "latest")
    assert m.data == {"micro_batch": 3} and m.world_size == 1
    load(u, folder)
    assert u.state.step == 3 and u.state.data == {"micro_batch": 3}
    assert torch.equal(torch.rand(3), r_ref)  # the RNG is where it was at the save
    assert [step(u, i) for i in (3, 4)] == pytest.approx(ref, rel=1e-6)  # weights + Adam state restored


def test_tampered_metadata_pickle_is_refused_without_running_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t = make()
    step(t, 0)
    ck_save.save(t, str(tmp_path / "ck"))
    folder, _ = catalog.resolve(str(tmp_path / "ck"))
    with open(os.path.join(folder, ".metadata"), "wb") as fh:
        pickle.dump(Boom(), fh)
    with pytest.raises(DamagedCheckpoint, match=r"\.metadata \(read by rank 0\) is (truncated|corrupt)"):
        load(make(), folder)  # the recorded size/checksum catches it first
    reseal(folder)  # the manifest edited too: the unpickler still refuses it
    with pytest.raises(UnsafeCheckpoint, match="posix.system|os.system"):
        load(make(), folder)
    assert not (tmp_path / "BOOM_MARKER").exists()
    with pytest.raises(UnsafeCheckpoint):
        export_safetensors(folder, str(tmp_path / "x.safetensors"))
    assert not (tmp_path / "BOOM_MARKER").exists()


def test_pickled_non_tensor_entries_are_refused(tmp_path, monkeypatch):
    import torch.distributed.checkpoint as dcp

    monkeypatch.chdir(tmp_path)
    t = make()
    ck_save.save(t, str(tmp_path / "ck"))
    folder, _ = catalog.resolve(str(tmp_path / "ck"))
    # rewrite the DCP part with an extra object entry (DCP would torch.load it weights_only=False)
    sd = {"model": {k: v.clone() for k, v in t.model.state_dict().items()}, "evil": Boom()}
    for f in os.listdir(folder):
        if f.endswith(".distcp") or f == ".metadata":
            os.remove(os.path.join(folder, f))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, checkpoint_id=folder, no_dist=True)
    reseal(folder)
    with pytest.raises(UnsafeCheckpoint, match="evil"):
        load(make(), folder)
    assert not (tmp_path / "BOOM_MARKER").exists()


def test_incompatible_shapes_and_keys_are_named(tmp_path):
    t = make()
    ck_save.save(t, str(tmp_path))
    folder, _ = catalog.resolve(str(tmp_path))
    with pytest.raises(IncompatibleCheckpoint) as err:
        load(make(hidden=6), folder)
    msg = str(err.value)
    assert "0.weight checkpoint (8, 4) vs model (6, 4)" in msg and "2.weight" in msg
    other = Target(model=torch.nn.Sequential(torch.nn.Linear(4, 8)), optimizer=None, state=TrainState())
    with pytest.raises(IncompatibleCheckpoint, match=r"in the checkpoint but not in the model 2\.bias, 2\.weight"):
        load(other, folder)


def test_autosave_retention_and_interrupted_save_is_invisible(tmp_path):
    root = str(tmp_path)
    t = make()
    ch._TARGET = t
    try:
        ch.set_autosave(root, every=2, keep=2, async_=True)
        for i in range(7):
            step(t, i)
            ch._AUTOSAVE({"step": t.state.step, "loss": t.state.loss})
        ck_save.wait()
        ch.step_done(float("nan"))  # step 8: non-finite loss is never auto-saved
        ck_save.wait()
    finally:
        ch.set_autosave(None, None)
        ch.untrack()
    names = [os.path.basename(f) for f, _ in catalog.entries(root)]
    assert names == ["step-00000004", "step-00000006"]
    # a killed save leaves NAME.tmp-*: never listed, never 'latest'
    os.makedirs(os.path.join(root, "step-00000009.tmp-00000000abcd"))
    open(os.path.join(root, "step-00000009.tmp-00000000abcd", MANIFEST), "w").write("{}")
    assert catalog.resolve(root, "latest")[1].step == 6
    ck_save.save(t, root, tag="best")
    assert catalog.resolve(root, "best")[1].step == 8 and catalog.resolve(root, "6")[1].step == 6
    assert catalog.delete(root, ["best"]) == ["best"]
    assert catalog.apply_retention(root, 1) == ["step-00000004"]
    out = export_safetensors(catalog.resolve(root)[0], str(tmp_path / "m.safetensors"))
    from safetensors.torch import load_file

    got = load_file(out["path"])
    assert sorted(got) == ["0.bias", "0.weight", "2.bias", "2.weight"] and out["step"] == 6
