"""Fine-tuning data from local files (one process): prompt-masked labels, packing without
attention across examples, JSON / JSONL / Parquet alike, bad rows refused by name.

The tokenizer is trained here on the bundled corpus (``workbench.models.tokenizer``) and
loaded back from its folder, as a user's would be: nothing is downloaded.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from workbench.engine.sft_data import IGNORE_INDEX, load_tokenizer, read_rows, sft_dataset  # noqa: E402

ROWS = [
    {
        "messages": [
            {"role": "system", "content": "You answer in one line."},
            {"role": "user", "content": "Who wrote the sonnets?"},
            {"role": "assistant", "content": "Shakespeare wrote them."},
            {"role": "user", "content": "And Alice?"},
            {"role": "assistant", "content": "Lewis Carroll."},
        ]
    },
    {"messages": [{"role": "user", "content": "Four score and"}, {"role": "assistant", "content": "seven years ago"}]},
    {"messages": [{"role": "user", "content": "Rabbit hole?"}, {"role": "assistant", "content": "Down it went."}]},
]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    from workbench.models.tokenizer import train_tokenizer

    return train_tokenizer(str(tmp_path_factory.mktemp("tok")), vocab_size=400)


@pytest.fixture(scope="module")
def tok(tok_dir):
    return load_tokenizer(tok_dir)


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return str(path)


def test_labels_are_minus_100_on_every_prompt_token_and_the_answers_are_trained(tok, jsonl):
    ds = sft_dataset(jsonl, tok, max_len=128)
    assert len(ds) == 3
    first = ds[0]
    ids, labels = first["input_ids"].tolist(), first["labels"].tolist()
    trained = [t for t in labels if t != IGNORE_INDEX]
    assert tok.decode(trained) == "Shakespeare wrote them.<|im_end|>\nLewis Carroll.<|im_end|>\n"
    prompt = [i for i, t in zip(ids, labels) if t == IGNORE_INDEX]
    text = tok.decode(prompt)
    for part in ("You answer in one line.", "Who wrote the sonnets?", "And Alice?", "<|im_start|>assistant\n"):
        assert part in text
    assert "Shakespeare" not in text and "Carroll" not in text
    assert all(t == i for i, t in zip(ids, labels) if t != IGNORE_INDEX)  # targets are the tokens themselves


def test_json_parquet_and_prompt_completion_rows_give_the_same_examples(tok, jsonl, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    as_json = tmp_path / "chat.json"
    as_json.write_text(json.dumps(ROWS))
    as_parquet = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), str(as_parquet))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(
            json.dumps({"prompt": r["messages"][0]["content"], "completion": r["messages"][1]["content"]}) + "\n"
            for r in ROWS[1:]
        )
    )
    ref = sft_dataset(jsonl, tok)
    for path in (str(as_json), str(as_parquet)):
        other = sft_dataset(path, tok)
        assert [other[i]["input_ids"].tolist() for i in range(3)] == [ref[i]["input_ids"].tolist() for i in range(3)]
        assert [other[i]["labels"].tolist() for i in range(3)] == [ref[i]["labels"].tolist() for i in range(3)]
    pc = sft_dataset(str(pairs), tok)
    assert [pc[i]["labels"].tolist() for i in range(2)] == [ref[i]["labels"].tolist() for i in (1, 2)]


def test_packed_rows_do_not_attend_across_examples(tok, jsonl):
    from transformers import LlamaConfig, LlamaForCausalLM

    packed = sft_dataset(jsonl, tok, max_len=96, pack=True)
    single = sft_dataset(jsonl, tok, max_len=96)
    assert len(packed) < len(single)  # examples share rows
    batch = packed.collate([packed[i] for i in range(len(packed))])
    assert "attention_mask" not in batch and batch["use_cache"] is False
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        logits = model(**batch).logits
        # the same row with positions running on across examples: attention crosses them
        crossing = model(input_ids=batch["input_ids"], use_cache=False).logits
    k, differs = 0, False
    for row, parts in enumerate(packed.rows):
        at = 0
        for ids, _ in parts:
            with torch.no_grad():
                alone = model(input_ids=torch.tensor([ids])).logits[0]
            got = logits[row, at : at + len(ids)]
            assert torch.allclose(got, alone, atol=1e-5), (row, at, float((got - alone).abs().max()))
            assert batch["labels"][row, at] == IGNORE_INDEX  # no target across the boundary
            differs |= at > 0 and not torch.allclose(crossing[row, at : at + len(ids)], alone, atol=1e-5)
            at += len(ids)
            k += 1
    assert k == 3 and differs  # the check can fail: without the reset, later examples see earlier ones


def test_bad_rows_and_files_are_refused_naming_what_would_work(tok, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "x", "answer": "y"}) + "\n")
    with pytest.raises(ValueError, match=r"row 0 has columns \['answer', 'question'\].*'messages'.*'prompt'"):
        sft_dataset(str(bad), tok)
    no_answer = tmp_path / "q.jsonl"
    no_answer.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(ValueError, match="no assistant turn"):
        sft_dataset(str(no_answer), tok)
    with pytest.raises(ValueError, match=r"\.json, \.jsonl or \.parquet"):
        read_rows(str(tmp_path / "data.csv"))
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_rows(str(tmp_path / "none.jsonl"))
