"""compile/memory.py: the default score bounds fit a 24 GiB machine (and build there); a build that
cannot fit is refused before compiling, naming the bound to lower."""

import json
from types import SimpleNamespace

import pytest

from boundgen.compile.memory import GIB, check_eager_fits, check_fits, estimate_bytes
from boundgen.errors import ConfigError
from boundgen.artifact.program import BeamSpec, ScoreSpec

QWEN3_06B = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "intermediate_size": 3072,
             "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
             "vocab_size": 151936, "tie_word_embeddings": True}
DEFAULT_SCORE = ScoreSpec(labels=(" yes", " no"), label_token_ids=(9693, 902))  # the defaults
BIG_SCORE = ScoreSpec(labels=(" yes", " no"), label_token_ids=(9693, 902), max_samples=64, max_tokens_per_sample=512)
HUGE_SCORE = ScoreSpec(labels=(" yes", " no"), label_token_ids=(9693, 902), max_samples=64,
                       max_tokens_per_sample=4096)  # activations of 262,144 tokens: ~40 GiB


def cfg(tmp_path, spec):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_06B))
    return SimpleNamespace(device="cpu", model_dir=tmp_path, spec=spec, dtype="float32")


def test_default_score_bounds_fit_24_gib():
    assert (DEFAULT_SCORE.max_samples, DEFAULT_SCORE.max_tokens_per_sample) == (16, 512)
    parts = estimate_bytes(QWEN3_06B, DEFAULT_SCORE, "float32")
    assert sum(parts.values()) < 24 * GIB, {k: v / GIB for k, v in parts.items()}
    # 64 samples of 512 tokens (the defaults before) fit too, now that the compiled attention goes
    # one sample at a time: its scores grow with 512^2, not with the [16, 32768, 32768] of the
    # whole packed batch (64 GiB).
    big = estimate_bytes(QWEN3_06B, BIG_SCORE, "float32")
    assert big["attention"] == 2 * 3 * 16 * 512 ** 2 * 4
    assert sum(big.values()) < 24 * GIB, {k: v / GIB for k, v in big.items()}


def test_build_that_cannot_fit_names_the_bound(tmp_path):
    with pytest.raises(ConfigError, match=r"needs about .* GiB .* lower --max-total-tokens"):
        check_fits(cfg(tmp_path, HUGE_SCORE), available=24 * GIB)
    with pytest.raises(ConfigError, match="lower --max-prompt-tokens or --max-requests"):
        check_fits(cfg(tmp_path, BeamSpec(width=400, steps=5, max_prompt_tokens=8192, max_requests=8)),
                   available=12 * GIB)
    with pytest.raises(ConfigError, match="lower --dtype bfloat16"):  # the weights alone do not fit
        check_fits(cfg(tmp_path, DEFAULT_SCORE), available=8 * GIB)
    check_fits(cfg(tmp_path, DEFAULT_SCORE), available=24 * GIB)  # fits: no error


def test_an_eager_run_that_cannot_fit_names_the_flag(tmp_path):
    """`boundgen score MODEL_DIR --max-tokens 30000`: a 30,000-token sample's attention scores alone are
    ~160 GiB on Qwen3-0.6B, refused before anything is loaded; the default 1,024 tokens fit 8 GiB."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_06B))
    long = ScoreSpec(labels=(" yes",), label_token_ids=(9693,), max_samples=1, max_tokens_per_sample=30_000,
                     max_total_tokens=30_000)
    with pytest.raises(ConfigError, match="could need about .* GiB .* lower --max-tokens"):
        check_eager_fits(tmp_path, long, "float32", "cpu", available=24 * GIB)
    check_eager_fits(tmp_path, long, "float32", "cuda", available=24 * GIB)  # GPU memory: the device's to report
    default = ScoreSpec(labels=(" yes",), label_token_ids=(9693,), max_samples=2, max_tokens_per_sample=1024,
                        max_total_tokens=2048)
    check_eager_fits(tmp_path, default, "float32", "cpu", available=8 * GIB)


@pytest.mark.parametrize("change, message", [
    ({"vocab_size": None}, "config.json is missing required keys: vocab_size"),  # a KeyError: "internal error"
    ({"num_hidden_layers": "2"}, "num_layers must be a positive integer, got '2'"),  # a TypeError
])
def test_the_memory_check_reads_only_a_checked_config(tmp_path, change, message):
    config = {k: v for k, v in {**QWEN3_06B, **change}.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = ScoreSpec(labels=(" yes",), label_token_ids=(9693,), max_samples=2, max_tokens_per_sample=8,
                     max_total_tokens=16)
    with pytest.raises(ConfigError, match=message):
        check_eager_fits(tmp_path, spec, "float32", "cpu", available=24 * GIB)


# The build's own peak: VmHWM of its address space. Not ru_maxrss, which Linux carries across exec from
# the address space the child started in (with vfork, the pytest process's: the whole suite's peak).
PEAK_SCRIPT = ("import sys; from boundgen.cli.main import main; code = main(sys.argv[1:]); "
               "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]; "
               "print(f'peak {hwm}', file=sys.stderr); sys.exit(code)")


@pytest.mark.slow
@pytest.mark.parametrize("bounds", [(), ("--max-samples", "64", "--max-tokens-per-sample", "512")],
                         ids=["defaults", "64x512"])
def test_a_first_build_fits_this_machine(tiny_qwen3_dir, tmp_path, bounds):
    """`boundgen build MODEL --task score --labels " yes" " no"` on the CPU, as a new user's first
    build, with the default bounds and with 64 samples x 512 tokens (the defaults before, which
    died at 24 GiB in validation): it passes validation; its peak memory is printed and grows with
    the samples' squared lengths, not the 32,768 tokens' (the [N_q, T, T] scores were > 16 GiB)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, "build", str(tiny_qwen3_dir), "--task", "score",
                          "--labels", " yes", " no", "--out", str(tmp_path / "art"), "--device", "cpu", *bounds],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    peak = int(out.stderr.rsplit("peak ", 1)[1].split()[0]) / 2**20  # KiB -> GiB
    print(f"build {' '.join(bounds) or 'with default bounds'}: peak resident memory {peak:.2f} GiB")
    assert json.loads(out.stdout.strip().splitlines()[-1])["validation_passed"]
    assert peak < 4, f"peak {peak:.1f} GiB"
