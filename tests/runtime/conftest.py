import pytest

from boundgen.artifact.program import ScoreSpec

from boundgen.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def score_spec(tiny_qwen3_dir):
    """A small score program: 6 samples, 64 tokens a call (the deadline and cancellation tests)."""
    ids = Tokenizer.from_dir(tiny_qwen3_dir).label_token_ids((" yes", " no"))
    return ScoreSpec(labels=(" yes", " no"), label_token_ids=ids, max_samples=6, max_tokens_per_sample=32,
                     max_total_tokens=64)
