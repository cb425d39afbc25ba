"""Effective MFU arithmetic, checked by hand on a tiny shape and against GPU.md's peer number."""

import pytest

from boundgen.bench import mfu
from boundgen.bench.mfu import ModelShape, beam_flops, effective_mfu, score_flops

# hidden 4, 2 layers, 2 q heads / 1 kv head of dim 2 (q size 4, kv size 2), intermediate 8, vocab 10
TINY = ModelShape(hidden_size=4, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=2, intermediate_size=8,
                  vocab_size=10)


def test_per_token_linear_flops_by_hand():
    per = TINY.linear_flops_per_token()
    assert per == {
        "qkv_proj": 2 * (2 * 4 * (4 + 2 + 2)),  # 2 layers x 2 x H x (Q + 2K) = 128
        "o_proj": 2 * (2 * 4 * 4),  # 64
        "gate_up_proj": 2 * (2 * 4 * 16),  # 256
        "down_proj": 2 * (2 * 8 * 4),  # 128
    }
    assert TINY.attention_flops_per_pair == 2 * 2 * 4 * 2  # layers x heads x 4 x D = 32
    assert TINY.lm_head_flops_per_row == 2 * 4 * 10


def test_score_flops_by_hand():
    f = score_flops(TINY, [1, 3])
    # 4 tokens x 576 linear; pairs 1 + 6 = 7 x 32; LM head 2 rows x 80
    assert f.by_group["qkv_proj"] == 4 * 128 and f.by_group["down_proj"] == 4 * 128
    assert f.by_group["attention"] == 7 * 32
    assert f.by_group["lm_head"] == 2 * 80
    assert f.total == 4 * 576 + 224 + 160 == 2688


def test_beam_flops_by_hand():
    f = beam_flops(TINY, prompt_len=3, width=2, steps=3)
    # tokens 3 + 2 x 2 = 7; pairs: prompt 6, decode step 1 attends 4 keys, step 2 five: 2 x (4 + 5) = 18
    assert f.by_group["gate_up_proj"] == 7 * 256
    assert f.by_group["attention"] == (6 + 18) * 32
    assert f.by_group["lm_head"] == (1 + 2 * 2) * 80  # 1 + W x (N_gen - 1) rows
    assert f.total == 7 * 576 + 24 * 32 + 5 * 80
    one_step = beam_flops(TINY, prompt_len=3, width=2, steps=1)  # prefill only, LM head at 1 row
    assert one_step.total == 3 * 576 + 6 * 32 + 80


def test_fp8_split_and_mfu():
    f = score_flops(TINY, [1, 3])
    bf16, fp8 = f.split(["mlp", "lm_head"])
    assert fp8 == 4 * (256 + 128) + 160 and bf16 == f.total - fp8
    peaks = {"bf16": 1000.0, "fp8": 2000.0}
    assert f.peak_seconds(["mlp", "lm_head"], peaks) == pytest.approx(bf16 / 1000 + fp8 / 2000)
    assert effective_mfu(3.0, f, (), peaks) == pytest.approx(3.0 * 2688 / 1000)
    with pytest.raises(ValueError, match="unknown FP8 linear group 'attention'"):
        f.split(["attention"])


def test_w1_peer_number_matches_gpu_md():
    """GPU.md: the HF peer on W1 (15 samples, 2,245 tokens) at 28 QPS is ~5.8% effective MFU."""
    lengths = [150] * 14 + [145]  # 2,245 tokens
    assert sum(lengths) == 2245
    value = effective_mfu(28.1, score_flops(mfu.SHAPES["qwen3-0.6b"], lengths))
    assert 0.055 < value < 0.060


def test_shape_from_model_config(tiny_qwen3_dir):
    from boundgen.model.loader import read_config

    cfg = read_config(tiny_qwen3_dir)
    shape = ModelShape.of(cfg)
    assert (shape.hidden_size, shape.num_layers, shape.head_dim) == (64, 2, 16)
    with pytest.raises(ValueError, match="num_layers"):
        ModelShape(4, 0, 2, 1, 2, 8, 10)
