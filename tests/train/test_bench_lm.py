"""The language-model benchmark's own measures (bench/lm_throughput.py), on a CPU and without Ray.

Real tokens are counted alike whatever the batch layout: TRL's collators' (padding-free, padded) and our
loop's (padded, packed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
from transformers import AutoTokenizer

from rocmtrain_train.data.lm_tokens import LmFormat, collate_lm, collate_packed, encode_lm, pack

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
from lm_throughput import real_tokens

RECORDS = [
    ("question : what colour is the zorb ? answer :", "red"),
    ("the food of the quill is fish . question : where does the quill live ? answer :", "cave"),
    ("question : the mimbo eats what ? answer :", "fish"),
]


def test_real_tokens_are_what_our_loop_counts_in_every_layout_of_either_loop(tiny_lm):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
    pad = tokenizer.pad_token_id
    assert pad != tokenizer.eos_token_id  # else an EOS would count as padding
    table = pa.table({"prompt": [p for p, _ in RECORDS], "response": [r for _, r in RECORDS]})
    rows = list(range(len(RECORDS)))
    encoded = encode_lm(tokenizer, table, rows, LmFormat("pairs", "response", 64))
    ours = int(encoded.lengths.sum())  # what our loop counts: the records' tokens
    records = [{"input_ids": encoded.ids[encoded.offsets[i] : encoded.offsets[i + 1]].tolist()} for i in rows]
    batches = {
        "trl padding-free": DataCollatorForLanguageModeling(pad_token_id=pad, padding_free=True)(records),
        "trl padded": DataCollatorForLanguageModeling(pad_token_id=pad)(records),
        "ours padded": collate_lm(encoded, rows, pad, multiple_of=8),
        "ours packed": collate_packed(encoded, pack(rows, encoded.lengths, 32), pad, multiple_of=8),
    }
    for layout, batch in batches.items():
        assert int(real_tokens(batch["input_ids"], pad)) == ours, layout
        if layout != "trl padding-free":
            assert batch["input_ids"].numel() > ours, layout  # these do compute on padding
