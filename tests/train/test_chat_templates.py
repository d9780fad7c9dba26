"""Chat templates as real models ship them: which tokens of a chat carry loss, and how its record ends (no Ray).

The tokenizer is Qwen-style and built here, offline: byte-level, one token per character, with `<|im_start|>`
and `<|im_end|>` as special tokens, so every expectation is the hand-tokenised text of each assistant turn.
Qwen3's own template is test data (tests/train/data/README.md says where it comes from).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import RocmTrainingJobSpec
from rocmtrain.api.models.chat_template_args import RESERVED_ARGS
from rocmtrain_train.data.causal_lm.tokens import LmFormat, encode_lm
from rocmtrain_train.data.tokens import Encoded
from rocmtrain_train.tasks.causal_lm import LanguageModel

QWEN3 = (Path(__file__).parent / "data" / "qwen3_chat_template.jinja").read_text()
# ChatML that marks the assistant's text, but not its end-of-turn mark, with {% generation %}.
MARKED = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}{% generation %}"
    "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# ChatML that writes only the last answer: the earlier ones cannot be found.
FORGETFUL = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role != 'assistant' or loop.last %}{{ m.content }}"
    "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# ChatML that writes each text backwards: the markers come out broken, and the turns are found as prefixes.
BACKWARDS = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | reverse }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHAT = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "What colour is the sky?"},
    {"role": "assistant", "content": "<think>\nIt is day.\n</think>\n\nBlue."},
    {"role": "user", "content": "And grass?"},
    {"role": "assistant", "content": "Green."},
]


def qwen_style(eos: str = "<|im_end|>") -> PreTrainedTokenizerFast:
    """A byte-level tokenizer without merges (every character one token) whose EOS is `eos`."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    made = PreTrainedTokenizerFast(
        tokenizer_object=core, additional_special_tokens=["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    )
    made.eos_token, made.pad_token = eos, "<|endoftext|>"
    made.chat_template = QWEN3
    return made


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return qwen_style()


def encode(tokenizer: Any, chat: list[dict[str, str]], template: str | None = None, **args: Any) -> Encoded:
    fmt = LmFormat("chat", "response", 4096, template, chat_template_args=args)
    return encode_lm(tokenizer, pa.table({"messages": [chat]}), [0], fmt)


def learned(encoded: Encoded) -> list[list[int]]:
    """The runs of consecutive tokens that carry loss."""
    assert encoded.loss_mask is not None
    runs: list[list[int]] = []
    previous = False
    for token, loss in zip(encoded.ids.tolist(), encoded.loss_mask.tolist(), strict=True):
        if loss and not previous:
            runs.append([])
        if loss:
            runs[-1].append(token)
        previous = bool(loss)
    return runs


def ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("args", [{}, {"enable_thinking": False}], ids=["thinking", "no-thinking"])
def test_qwen3_multi_turn_chat_learns_exactly_each_answer_and_its_end_of_turn(tokenizer, args):
    encoded = encode(tokenizer, CHAT, **args)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # the past answer as Qwen3 renders it (its reasoning dropped), the last without the empty <think> block
    assert learned(encoded) == [[*ids(tokenizer, "Blue."), end], [*ids(tokenizer, "Green."), end]]
    text = tokenizer.decode(encoded.ids.tolist())
    assert text == tokenizer.apply_chat_template(CHAT, tokenize=False, **args).rstrip("\n")
    prompt = tokenizer.decode(encoded.ids[: encoded.response_starts[0]].tolist())
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_the_prompt_of_the_last_answer_is_qwen3s_generation_prompt_without_thinking(tokenizer):
    encoded = encode(tokenizer, CHAT, enable_thinking=False)
    prompt = tokenizer.decode(encoded.ids[: encoded.response_starts[0]].tolist())
    assert prompt == tokenizer.apply_chat_template(
        CHAT[:-1], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )


def test_an_answer_that_carries_reasoning_learns_it(tokenizer):
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>\nGreet.\n</think>\n\nHello"}]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert learned(encode(tokenizer, chat)) == [[*ids(tokenizer, "<think>\nGreet.\n</think>\n\nHello"), end]]


@pytest.mark.parametrize("eos", ["<|im_end|>", "<|endoftext|>"])
def test_a_chatml_record_ends_with_one_eos_and_learns_up_to_it(eos):
    tokenizer = qwen_style(eos)
    encoded = encode(tokenizer, [CHAT[1], {"role": "assistant", "content": "Blue."}])
    end, other = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    ending = [end] if eos == "<|im_end|>" else [end, other]  # the turn's end mark is EOS, or EOS follows it
    assert encoded.ids[-len(ending) - 1 :].tolist() == ids(tokenizer, ".") + ending  # no newline, no second EOS
    assert learned(encoded) == [ids(tokenizer, "Blue.") + ending]


def test_a_template_with_generation_marks_is_taken_at_its_word(tokenizer):
    # the marks leave the end-of-turn mark out, which every other rule would learn
    assert learned(encode(tokenizer, CHAT, MARKED)) == [ids(tokenizer, CHAT[2]["content"]), ids(tokenizer, "Green.")]


def test_a_template_that_rewrites_the_text_has_its_turns_found_as_prefixes(tokenizer):
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    expected = [[*ids(tokenizer, CHAT[2]["content"][::-1]), end], [*ids(tokenizer, ".neerG"), end]]
    assert learned(encode(tokenizer, CHAT, BACKWARDS)) == expected


def test_a_template_that_drops_past_answers_is_refused(tokenizer):
    with pytest.raises(ConfigError, match="assistant turns cannot be found"):
        encode(tokenizer, CHAT, FORGETFUL)


def test_template_options_reach_the_template(tokenizer):
    template = "{{ greeting }}" + MARKED
    encoded = encode(tokenizer, CHAT[1:3], template, greeting="Hello!")
    assert tokenizer.decode(encoded.ids[: encoded.response_starts[0]].tolist()).startswith("Hello!<|im_start|>")


def test_the_jobs_options_reach_the_template_as_json_values_or_text():
    args = {"enable_thinking": "false", "days": "3", "heat": "0.5", "mode": '"true"', "persona": "a terse tutor"}
    data = {"train": {"uri": "/d"}, "messagesField": "chat", "chatTemplateArgs": args}
    spec = RocmTrainingJobSpec.model_validate({"model": {"source": "/m", "task": "causal-lm"}, "data": data})
    assert LanguageModel(spec).format.chat_template_args == {
        "enable_thinking": False,
        "days": 3,
        "heat": 0.5,
        "mode": "true",
        "persona": "a terse tutor",
    }


def test_no_option_may_take_the_name_of_what_apply_chat_template_sets_itself():
    own = set(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters) - {"self", "kwargs"}
    assert own | {"messages", "conversations"} <= set(RESERVED_ARGS)
