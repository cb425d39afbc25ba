"""bench/gemms.py: the cases, the FP8 rowwise quantization (checked on CPU), a clear refusal without CUDA."""

import pytest
import torch

from boundgen.bench import gemms


def test_cases_are_the_models_projections_at_the_workloads_rows():
    shapes = gemms.gemm_shapes(["W2", "W1"])
    assert ("W2 gate_up M=100", 100, 9728, 896, False) in shapes
    assert ("W2 qkv M=400", 400, 1152, 896, True) in shapes  # Qwen2's qkv bias
    assert ("W1 down M=2250", 2250, 1024, 3072, False) in shapes
    with pytest.raises(ValueError, match="unknown workloads"):
        gemms.gemm_shapes(["W9"])


def test_rowwise_fp8_round_trip_keeps_each_row_within_e4m3_precision():
    x = torch.randn(7, 64) * torch.logspace(-3, 3, 7)[:, None]  # rows of very different scales
    q, scale = gemms.quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (7, 1)
    back = q.float() * scale
    assert gemms.sqnr_db(back, x) > 25  # e4m3: 3 mantissa bits, ~30 dB on Gaussian rows
    assert gemms.sqnr_db(x, x) == float("inf")


def test_main_refuses_without_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    assert gemms.main(["--workloads", "W2"]) == 2
    assert "need a CUDA device" in capsys.readouterr().err


def test_cold_weights_come_round_only_after_more_than_l2():
    assert gemms.cold_copies(896 * 1152 * 2) == 66  # W2 qkv, 2 MB: 66 copies, 136 MB
    assert gemms.cold_copies(151936 * 896 * 2) == 2  # the LM head alone is 272 MB
    assert all(gemms.cold_copies(b) * b >= gemms.WEIGHT_BYTES_COLD for b in (1, 10 ** 6, 17 * 10 ** 6))
