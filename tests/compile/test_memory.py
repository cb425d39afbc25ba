"""compile/memory.py: the default score bounds fit a 24 GiB machine; a build that cannot fit is refused
before compiling, naming the bound to lower."""

import json
from types import SimpleNamespace

import pytest

from boundgen.compile.memory import GIB, check_fits, estimate_bytes
from boundgen.errors import ConfigError
from boundgen.artifact.program import BeamSpec, ScoreSpec

QWEN3_06B = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True}
DEFAULT_SCORE = ScoreSpec(labels=(" yes", " no"), label_token_ids=(9693, 902), max_samples=64,
                          max_tokens_per_sample=512, max_total_tokens=64 * 512)


def cfg(tmp_path, spec):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_06B))
    return SimpleNamespace(device="cpu", model_dir=tmp_path, spec=spec, dtype="float32")


def test_default_score_bounds_fit_24_gib():
    parts = estimate_bytes(QWEN3_06B, DEFAULT_SCORE, "float32")
    assert sum(parts.values()) < 24 * GIB, {k: v / GIB for k, v in parts.items()}
    # What the old whole-batch reference needed for its [N_q, T, T] FP32 scores alone:
    assert 16 * (64 * 512) ** 2 * 4 > 24 * GIB


def test_build_that_cannot_fit_names_the_bound(tmp_path):
    with pytest.raises(ConfigError, match=r"needs about .* GiB .* lower --max-total-tokens"):
        check_fits(cfg(tmp_path, DEFAULT_SCORE), available=12 * GIB)
    with pytest.raises(ConfigError, match="lower --max-prompt-tokens or --max-requests"):
        check_fits(cfg(tmp_path, BeamSpec(width=400, steps=5, max_prompt_tokens=8192, max_requests=8)),
                   available=12 * GIB)
    with pytest.raises(ConfigError, match="lower --dtype bfloat16"):  # the weights alone do not fit
        check_fits(cfg(tmp_path, DEFAULT_SCORE), available=8 * GIB)
    check_fits(cfg(tmp_path, DEFAULT_SCORE), available=64 * GIB)  # fits: no error
