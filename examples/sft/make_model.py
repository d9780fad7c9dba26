"""Make the small causal language model of the language-model example, from a config: no download.

No language model can be downloaded where this project is built and tested, so the example trains a
small Llama-architecture model with random weights (about 0.2 M parameters) on the words of its
data: a word-level tokenizer with `<s>`, `</s>`, `<pad>` and `<unk>`, a chat template for chat
records, and a model config sized to learn the example's task on two CPU workers in minutes. On a
cluster, point `model.source` at a real model instead (examples/cluster-llama-lora-mi300x.yaml).

    python examples/sft/make_model.py examples/sft/model     # what examples/sft-local.yaml trains
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, pre_tokenizers, processors
from tokenizers.models import WordLevel
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).parent))
from generate import vocabulary

SPECIAL = ["<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
PAD, BOS, EOS, UNK = SPECIAL[:4]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% if m['role'] == 'assistant' %}</s> "
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
SIZE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 256,
}


def tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer of `words` that starts every text with <s>."""
    vocab = {token: i for i, token in enumerate([*SPECIAL, *words])}
    core = Tokenizer(WordLevel(vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    made = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=SPECIAL[4:],
    )
    made.chat_template = CHAT_TEMPLATE
    return made


def build(folder: Path, words: list[str] | None = None, *, seed: int = 0, **size: int) -> Path:
    """Save a randomly initialised Llama and its tokenizer of `words` (the example's vocabulary) in `folder`;
    `size` overrides the config's sizes (`SIZE`, or any other LlamaConfig field)."""
    made = tokenizer(vocabulary() if words is None else words)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(made),
        bos_token_id=made.bos_token_id,
        eos_token_id=made.eos_token_id,
        pad_token_id=made.pad_token_id,
        tie_word_embeddings=True,
        **{**SIZE, **size},
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    made.save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"model saved to {build(args.folder, seed=args.seed)}")


if __name__ == "__main__":
    main()
