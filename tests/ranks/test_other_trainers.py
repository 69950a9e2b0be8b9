"""Tier 2: a Hugging Face Trainer and a hand-written loop on the shared 2-rank set, through
``%%distrain`` in a real IPython shell, reach ``workbench.metrics()`` per rank.

The model is a tiny random Llama built on the ranks (nothing downloaded)."""

import math
import time
import uuid

import pytest

from workbench.notebook import stream
from workbench.notebook.metrics import metrics

SEQ, BATCH, STEPS, LOG_EVERY = 16, 4, 6, 2

HF_CELL = f"""%%distrain
import torch, tempfile
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
from workbench import engine

torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings={SEQ})
model = LlamaForCausalLM(cfg)
g = torch.Generator().manual_seed(1 + engine.rank)
ids = torch.randint(0, 64, ({BATCH * STEPS}, {SEQ}), generator=g)
data = [{{"input_ids": x, "labels": x}} for x in ids]
out = tempfile.mkdtemp(prefix="wb-hf-")
args = TrainingArguments(output_dir=out, use_cpu=True, report_to=[], max_steps={STEPS},
                         per_device_train_batch_size={BATCH}, logging_steps={LOG_EVERY},
                         save_strategy="no", disable_tqdm=True, learning_rate=1e-3,
                         include_num_input_tokens_seen="all")
hf_trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[engine.hf_callback()])
hf_trainer.train()
hf_logged = [(h["step"], h["loss"]) for h in hf_trainer.state.log_history if "loss" in h]
hf_world = hf_trainer.args.world_size
import shutil; shutil.rmtree(out)
"""


@pytest.fixture
def lab_mirror(ranks2):
    """The stream's copy for the Lab's server (made as the registry makes it), and a reader of
    it as the server has; the shared set's collector is left as found."""
    from workbench.labserver.monitor import StreamReader
    from workbench.notebook.stream.mirror import Mirror

    collector = stream.attach(ranks2)  # as `%distrain start` does for a set it starts
    made = collector.mirror is None
    if made:
        collector.mirror = Mirror()
    reader = StreamReader(collector.mirror.address, collector.mirror.public_key)
    try:
        yield reader
    finally:
        reader.close()
        if made:
            mirror, collector.mirror = collector.mirror, None
            mirror.close()


def test_hf_trainer_run_in_distrain_cell_streams_every_logged_loss_per_rank(shell2, ranks2, lab_mirror):
    store = stream.attach(ranks2).store
    result = shell2.run_cell(HF_CELL)
    assert result.success, result.error_in_exec
    assert ranks2.pull("hf_world") == [2, 2]  # DDP through Accelerate on both ranks
    logged = ranks2.pull("hf_logged")
    assert [s for s, _ in logged[0]] == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    run = store.latest_run()
    assert run.startswith("hf-")
    got = store.wait(lambda s: len(s.snapshot_rows(run)) == 2 * STEPS, timeout=60)
    assert got, [(r["rank"], r["step"], r.get("loss")) for r in store.snapshot_rows(run)]  # one run id, both ranks
    tidy = metrics(run)
    assert set(tidy.source) == {"hf"}
    loss = tidy[tidy.metric == "loss"]
    for rank in (0, 1):
        mine = loss[loss["rank"] == rank]
        # the Trainer's own logged loss (its mean over the ranks), at every logged step
        assert list(zip(mine.step, mine.value)) == [(s, v) for s, v in logged[rank]]
    wide = metrics(run, wide=True)
    for rank in (0, 1):
        assert sorted(wide[wide["rank"] == rank].step) == list(range(1, STEPS + 1))  # every step once
    at_log = wide[wide.step % LOG_EVERY == 0]
    assert (at_log.lr > 0).all() and at_log.grad_norm.map(math.isfinite).all()
    # the Trainer's own count over both ranks, at its logs
    assert list(at_log.tokens_seen) == [2 * BATCH * SEQ * s for s in at_log.step]
    assert (wide.tokens == BATCH * SEQ).all() and (wide.samples == BATCH).all()
    later = wide[wide.step > 1]
    assert (later.tps > 0).all() and (later.time_step_s > 0).all()
    assert (wide.memory_rss_bytes > 0).all()
    assert (wide.epoch > 0).all()
    # the Lab's server reads the same steps: each rank's last step and its logged loss
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(lab_mirror.last.get(r, {}).get("step") != STEPS for r in (0, 1)):
        time.sleep(0.1)
    for rank in (0, 1):
        last = lab_mirror.last[rank]
        assert (last["run"], last["step"], last["loss"]) == (run, STEPS, logged[rank][-1][1])


LOOP_CELL = """%%distrain
import torch
import torch.distributed as dist
from workbench import engine

torch.manual_seed(engine.rank)
net = torch.nn.Linear(8, 1)
ddp = torch.nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
loop_losses = []
for step in range(1, 6):
    x = torch.randn(16, 8)
    loss = ((ddp(x) - x.sum(1, keepdim=True)) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    mean = loss.detach().clone(); dist.all_reduce(mean); mean /= engine.world_size
    engine.report(step=step, loss=mean.item(), loss_local=loss.item(), run=RUN, batch=x, lr=0.1)
    loop_losses.append((mean.item(), loss.item()))
from workbench.engine import publisher
publisher.flush()
"""


def test_plain_loop_reports_per_rank_with_measured_throughput_and_collectives(shell2, ranks2):
    store = stream.attach(ranks2).store
    run = f"plain-loop-{uuid.uuid4().hex[:8]}"
    ranks2.push({"RUN": run})
    assert shell2.run_cell(LOOP_CELL).success
    assert store.wait(lambda s: len(s.snapshot_rows(run)) == 10, timeout=60)
    losses = ranks2.pull("loop_losses")
    wide = metrics(run, wide=True)
    assert set(wide.source) == {"user"}
    for rank in (0, 1):
        mine = wide[wide["rank"] == rank]
        assert list(mine.step) == [1, 2, 3, 4, 5]
        assert list(zip(mine.loss, mine.loss_local)) == losses[rank]
    assert (wide.tokens == 16 * 8).all() and (wide.samples == 16).all()
    later = wide[wide.step > 1]
    assert (later.tps > 0).all() and (later.samples_per_s > 0).all()
    # the loop's own all-reduce of the loss, counted by the workbench between two reports
    assert (later["comm/all_reduce/count"] == 1).all()
    assert (wide.memory_rss_bytes > 0).all()
