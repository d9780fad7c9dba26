"""The benchmarks' own tests (bench/): their measures and smoke modes, each a bench's code run small, so that a change
in the code under a bench breaks the suite, not the next benchmark. They start their own Ray where they need one and
share nothing with the training tests' embedded Ray, so they run in the second pytest session, beside those
(docs/development/tests.md#two-sessions-at-once). The tiny Llama is the training tests' fixture."""

from train.conftest import tiny_lm

__all__ = ["tiny_lm"]
