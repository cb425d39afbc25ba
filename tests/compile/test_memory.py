"""compile/memory.py: the default score bounds fit a 24 GiB machine (and build there); a build that
cannot fit is refused before compiling, naming the bound to lower."""

import json
from types import SimpleNamespace

import pytest

from boundgen.compile.memory import GIB, check_fits, estimate_bytes
from boundgen.errors import ConfigError
from boundgen.artifact.program import BeamSpec, ScoreSpec

QWEN3_06B = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True}
DEFAULT_SCORE = ScoreSpec(labels=(" yes", " no"), label_token_ids=(9693, 902))  # the defaults
BIG_SCORE = ScoreSpec(labels=(" yes", " no"), label_token_ids=(9693, 902), max_samples=64, max_tokens_per_sample=512)


def cfg(tmp_path, spec):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_06B))
    return SimpleNamespace(device="cpu", model_dir=tmp_path, spec=spec, dtype="float32")


def test_default_score_bounds_fit_24_gib():
    assert (DEFAULT_SCORE.max_samples, DEFAULT_SCORE.max_tokens_per_sample) == (16, 512)
    parts = estimate_bytes(QWEN3_06B, DEFAULT_SCORE, "float32")
    assert sum(parts.values()) < 24 * GIB, {k: v / GIB for k, v in parts.items()}
    # 64 samples of 512 tokens (the defaults before): the compiled attention's [N_q, T, T] FP32
    # scores alone are 64 GiB, and the estimate says so.
    assert estimate_bytes(QWEN3_06B, BIG_SCORE, "float32")["attention"] > 2 * 16 * (64 * 512) ** 2 * 4 - GIB


def test_build_that_cannot_fit_names_the_bound(tmp_path):
    with pytest.raises(ConfigError, match=r"needs about .* GiB .* lower --max-total-tokens"):
        check_fits(cfg(tmp_path, BIG_SCORE), available=24 * GIB)
    with pytest.raises(ConfigError, match="lower --max-prompt-tokens or --max-requests"):
        check_fits(cfg(tmp_path, BeamSpec(width=400, steps=5, max_prompt_tokens=8192, max_requests=8)),
                   available=12 * GIB)
    with pytest.raises(ConfigError, match="lower --dtype bfloat16"):  # the weights alone do not fit
        check_fits(cfg(tmp_path, DEFAULT_SCORE), available=8 * GIB)
    check_fits(cfg(tmp_path, DEFAULT_SCORE), available=24 * GIB)  # fits: no error


@pytest.mark.slow
def test_a_first_build_on_the_default_bounds_fits_this_machine(tiny_qwen3_dir, tmp_path):
    """`boundgen build MODEL --task score --labels " yes" " no"` with every bound at its default, on
    the CPU, as a new user's first build: it passes validation; its peak memory is printed."""
    import resource
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "boundgen", "build", str(tiny_qwen3_dir), "--task", "score",
                          "--labels", " yes", " no", "--out", str(tmp_path / "art"), "--device", "cpu"],
                         capture_output=True, text=True, timeout=900)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB
    print(f"default-bounds build: peak resident memory {peak:.2f} GiB")
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["validation_passed"]
