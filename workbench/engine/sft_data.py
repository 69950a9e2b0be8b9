"""Supervised fine-tuning data from local files: chat-templated, prompt-masked, optionally packed.

``sft_dataset(path, tokenizer)`` reads local JSON, JSONL or Parquet (no hub), renders each
row with the tokenizer's chat template and labels only the assistant turns, so the loss is
the answers'. The result is a map-style ``Dataset`` the trainer shards and resumes exactly;
the row forms and packing are in docs/finetune.md."""

from __future__ import annotations

import os

import torch

__all__ = ["SFTDataset", "sft_dataset", "read_rows", "load_tokenizer", "IGNORE_INDEX"]

IGNORE_INDEX = -100
_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def load_tokenizer(folder: str):
    """A tokenizer from a local folder (``tokenizer.json`` ...); never the hub."""
    from transformers import AutoTokenizer

    folder = os.path.abspath(os.path.expanduser(folder))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder} is not a folder: give the folder a tokenizer was saved to")
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def read_rows(path: str | list[str]) -> list[dict]:
    """The rows of local JSON / JSONL / Parquet files, through ``datasets`` (kept in memory)."""
    from datasets import load_dataset

    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    paths = [os.path.abspath(os.path.expanduser(str(p))) for p in paths]
    kinds = {_FORMATS.get(os.path.splitext(p)[1].lower()) for p in paths}
    if None in kinds or len(kinds) != 1:
        raise ValueError(
            f"read {paths}: give .json, .jsonl or .parquet files, all of one kind (found extensions "
            f"{sorted({os.path.splitext(p)[1] for p in paths})})"
        )
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise FileNotFoundError(f"no such file: {', '.join(missing)}")
    ds = load_dataset(kinds.pop(), data_files=paths, split="train", keep_in_memory=True)
    return ds.to_list()


def _messages(row: dict, i: int) -> list[dict]:
    if "messages" in row and row["messages"] is not None:
        msgs = row["messages"]
    elif "prompt" in row and "completion" in row:
        msgs = [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["completion"]}]
    else:
        raise ValueError(
            f"row {i} has columns {sorted(row)}: give 'messages' (a list of {{'role', 'content'}}) "
            "or 'prompt' and 'completion'"
        )
    if not any(m.get("role") == "assistant" for m in msgs):
        raise ValueError(
            f"row {i} has no assistant turn: nothing to learn from it (roles: {[m.get('role') for m in msgs]})"
        )
    return [{"role": m["role"], "content": m["content"]} for m in msgs]


def tokenize_chat(tokenizer, msgs: list[dict], *, chat_template: str | None = None) -> tuple[list[int], list[int]]:
    """(input ids, labels) of one conversation: labels -100 except on the assistant turns.

    An assistant turn spans from the end of the template rendered up to it with the
    generation prompt to the end of the template rendered through it (its end-of-turn token
    included, so the model learns to stop); tokens are assigned by their character offsets."""

    def render(part, gen):
        return tokenizer.apply_chat_template(
            part, tokenize=False, add_generation_prompt=gen, chat_template=chat_template
        )

    text = render(msgs, False)
    spans = []
    for j, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        start, through = render(msgs[:j], True), render(msgs[: j + 1], False)
        if not text.startswith(through) or not through.startswith(start):
            raise ValueError(
                "the chat template does not render a conversation's beginning as a prefix of the whole "
                "(needed to find the assistant turns): use a template whose turns are appended in order"
            )
        spans.append((len(start), len(through)))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    labels = [t if any(s <= a < e for s, e in spans) else IGNORE_INDEX for t, (a, _) in zip(ids, enc["offset_mapping"])]
    return ids, labels


class SFTDataset(torch.utils.data.Dataset):
    """Tokenized, prompt-masked examples, or packed rows of them.

    Packed: whole examples in file order fill rows of ``max_len``, each example's
    ``position_ids`` starting at 0 and no ``attention_mask``, so ``transformers`` builds a
    block-diagonal causal mask and no token attends across examples. Unpacked rows are
    padded to the batch's longest, labels -100 on padding. Every rank tokenizes the whole
    file alike, so the rows are the same everywhere."""

    def __init__(
        self,
        rows: list[dict],
        tokenizer,
        *,
        max_len: int = 512,
        pack: bool = False,
        chat_template: str | None = None,
    ):
        if max_len < 2:
            raise ValueError(f"max_len={max_len}: an example needs at least 2 tokens")
        if chat_template is None and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the tokenizer has no chat template: pass chat_template= (a Jinja template over `messages`), "
                "e.g. workbench.models.tokenizer.CHATML"
            )
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise ValueError("the tokenizer has neither a pad nor an end-of-sequence token to pad with")
        self.pad_id, self.max_len, self.pack = int(pad), max_len, pack
        self.examples = []
        self.truncated = self.dropped = 0  # examples cut to max_len; of those, left without an answer token
        for i, row in enumerate(rows):
            ids, labels = tokenize_chat(tokenizer, _messages(row, i), chat_template=chat_template)
            if len(ids) > max_len:
                self.truncated += 1
                ids, labels = ids[:max_len], labels[:max_len]
            labels[0] = IGNORE_INDEX  # never a target of what precedes it (in a packed row)
            if all(t == IGNORE_INDEX for t in labels):  # the prompt fills max_len: no answer left to learn
                self.dropped += 1
                continue
            self.examples.append((ids, labels))
        if not self.examples:
            raise ValueError(
                f"no examples left of {len(rows)} rows"
                + (
                    f" ({self.dropped} had no answer token within max_len={max_len}: raise max_len)"
                    if self.dropped
                    else ""
                )
            )
        self.rows = self._packed() if pack else [[e] for e in self.examples]

    def _packed(self) -> list[list[tuple]]:
        """Whole examples in file order, a new row when the next one does not fit."""
        rows, cur, used = [], [], 0
        for ex in self.examples:
            if cur and used + len(ex[0]) > self.max_len:
                rows.append(cur)
                cur, used = [], 0
            cur.append(ex)
            used += len(ex[0])
        if cur:
            rows.append(cur)
        return rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        parts = self.rows[i]
        ids = [t for p in parts for t in p[0]]
        labels = [t for p in parts for t in p[1]]
        pos = [j for p in parts for j in range(len(p[0]))]
        return {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "labels": torch.tensor(labels, dtype=torch.long),
            "position_ids": torch.tensor(pos, dtype=torch.long),
        }

    def collate(self, items: list[dict]) -> dict:
        """A batch: padded to the longest row (packed: to ``max_len``), as the model's keyword arguments."""
        width = self.max_len if self.pack else max(len(x["input_ids"]) for x in items)
        ids = torch.full((len(items), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(items), width), IGNORE_INDEX, dtype=torch.long)
        pos = torch.zeros((len(items), width), dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for r, x in enumerate(items):
            n = len(x["input_ids"])
            ids[r, :n], labels[r, :n], pos[r, :n], mask[r, :n] = x["input_ids"], x["labels"], x["position_ids"], 1
            pos[r, n:] = torch.arange(width - n)  # padding: a sequence of its own, never a target
        if self.pack:  # block-diagonal attention from the position ids (module doc)
            return {"input_ids": ids, "labels": labels, "position_ids": pos, "use_cache": False}
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    def describe(self) -> str:
        tokens = sum(len(e[0]) for e in self.examples)
        targets = sum(sum(t != IGNORE_INDEX for t in e[1]) for e in self.examples)
        how = f"packed into {len(self.rows)} rows of {self.max_len}" if self.pack else f"{len(self.rows)} rows"
        return f"{len(self.examples)} examples, {tokens} tokens ({targets} trained on, the rest prompt), {how}" + (
            f"; {self.truncated} truncated to {self.max_len}" if self.truncated else ""
        )


def sft_dataset(
    path: str | list[str],
    tokenizer,
    *,
    max_len: int = 512,
    pack: bool = False,
    chat_template: str | None = None,
) -> SFTDataset:
    """An :class:`SFTDataset` of local JSON/JSONL/Parquet file(s); ``tokenizer``: an object or a folder."""
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(str(tokenizer))
    return SFTDataset(read_rows(path), tokenizer, max_len=max_len, pack=pack, chat_template=chat_template)
