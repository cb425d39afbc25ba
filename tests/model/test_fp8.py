"""Selective FP8 (model/fp8.py): the rowwise E4M3 quantization, the FP8 linear against the bf16 one,
the MLP (and with "mlp,attn" the attention's projections) of a model put in FP8 against the FP32
model, a beam decode step of such a model against the bf16 one, and on CUDA `torch._scaled_mm`
against the emulation the CPU runs."""

import math

import pytest
import torch
import torch.nn.functional as F

from boundgen.errors import ConfigError
from boundgen.model import fp8
from boundgen.model.loader import load_model
from boundgen.ops.lowering import OpLowering
from tests.ops.decode_testing import decode


def sqnr_db(approx: torch.Tensor, exact: torch.Tensor) -> float:
    noise = (approx.double() - exact.double()).pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(exact.double().pow(2).sum().item() / noise)


def test_rowwise_quantization_keeps_rows_of_any_scale_within_e4m3_precision():
    x = torch.randn(6, 64) * torch.logspace(-4, 4, 6)[:, None]
    q, scale = fp8.quantize_rows(x)
    assert q.dtype == fp8.E4M3 and scale.shape == (6, 1) and scale.dtype == torch.float32
    assert q.float().abs().amax(dim=1).allclose(torch.full((6,), fp8.E4M3_MAX))  # each row spans the range
    back = q.float() * scale
    for row, exact in zip(back, x):
        assert sqnr_db(row, exact) > 25  # 3 mantissa bits: ~30 dB on Gaussian rows
    zero_q, zero_scale = fp8.quantize_rows(torch.zeros(2, 8))  # no division by zero
    assert torch.equal(zero_q.float(), torch.zeros(2, 8)) and (zero_scale > 0).all()


def test_fp8_linear_is_the_bf16_linear_within_e4m3_noise():
    gen = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(128, 96, bias=False).to(torch.bfloat16)
    linear.weight.data = (torch.randn(96, 128, generator=gen) / 11).to(torch.bfloat16)
    x = torch.randn(40, 128, generator=gen).to(torch.bfloat16)
    quantized = fp8.FP8Linear(linear)
    got = quantized(x)
    assert got.dtype == torch.bfloat16 and got.shape == (40, 96)
    assert (quantized.in_features, quantized.out_features) == (128, 96)
    assert 24 < sqnr_db(got, F.linear(x, linear.weight)) < 40  # quantized, and not wildly so
    assert quantized.bias is None


def test_fp8_linear_adds_its_bias_to_the_bf16_product():
    gen = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(64, 48).to(torch.bfloat16)
    linear.weight.data = (torch.randn(48, 64, generator=gen) / 8).to(torch.bfloat16)
    linear.bias.data = torch.randn(48, generator=gen).to(torch.bfloat16)
    x = torch.randn(37, 64, generator=gen).to(torch.bfloat16)
    quantized = fp8.FP8Linear(linear)
    x_q, x_scale = fp8.quantize_rows(x)
    product = fp8.emulated_scaled_mm(x_q, x_scale, quantized.weight_q, quantized.weight_scale, torch.bfloat16)
    assert quantized.bias.dtype == torch.bfloat16 and torch.equal(quantized.bias, linear.bias.detach())
    assert torch.equal(quantized(x), product + linear.bias.detach())
    assert torch.equal(quantized.quantized(x_q, x_scale), quantized(x))
    assert sqnr_db(quantized(x), F.linear(x, linear.weight, linear.bias)) > 24


@pytest.mark.parametrize("mode,attention", [("mlp", False), ("mlp,attn", True)])
def test_quantize_puts_the_projections_of_its_mode_in_fp8_and_nothing_else(tiny_qwen2_dir, mode, attention):
    model = fp8.quantize(load_model(tiny_qwen2_dir, torch.bfloat16), mode)
    for layer in model.layers:
        assert isinstance(layer.mlp.gate_up_proj, fp8.FP8Linear) and isinstance(layer.mlp.down_proj, fp8.FP8Linear)
        for projection in (layer.self_attn.qkv_proj, layer.self_attn.o_proj):
            assert isinstance(projection, fp8.FP8Linear) == attention
        assert layer.self_attn.qkv_proj.bias is not None  # Qwen2's qkv bias, kept either way
    untouched = load_model(tiny_qwen2_dir, torch.bfloat16)
    assert fp8.quantize(untouched, "none") is untouched
    assert isinstance(untouched.layers[0].mlp.down_proj, torch.nn.Linear)
    with pytest.raises(ConfigError, match="fp8 must be one of"):
        fp8.quantize(untouched, "all")


@pytest.mark.parametrize("checkpoint", ["tiny_qwen2_dir", "tiny_qwen3_dir"])
def test_an_fp8_model_scores_close_to_the_fp32_model(checkpoint, request):
    path = request.getfixturevalue(checkpoint)
    tokens = torch.randint(0, 500, (23,), generator=torch.Generator().manual_seed(2))
    positions, cu = torch.arange(23), torch.tensor([0, 23], dtype=torch.int32)

    def logits(model):
        hidden, _ = model.prefill(tokens, positions, cu)
        return model.logits(hidden).float()
    exact = logits(load_model(path, torch.float32))
    bf16 = logits(load_model(path, torch.bfloat16))
    mlp = logits(fp8.quantize(load_model(path, torch.bfloat16), "mlp"))
    both = logits(fp8.quantize(load_model(path, torch.bfloat16), "mlp,attn"))
    assert sqnr_db(mlp, exact) > 20 and sqnr_db(both, exact) > 20
    assert sqnr_db(mlp, exact) < sqnr_db(bf16, exact)  # the MLP really runs in FP8
    assert sqnr_db(both, exact) < sqnr_db(mlp, exact)  # and the attention's projections too


@pytest.mark.parametrize("checkpoint", ["tiny_qwen2_dir", "tiny_qwen3_dir"])
def test_an_fp8_attention_model_decodes_beams_close_to_the_bf16_model(checkpoint, request):
    """--fp8 mlp,attn in a beam step, the fused K/V write (rope_kv_write: Qwen2, no q/k norm) and
    the quantizing norms lowered: the same hidden states and K/V as without the lowerings (their
    CPU kernels are the references), close to the bf16 model's."""
    path = request.getfixturevalue(checkpoint)
    lowered = OpLowering(rope_kv_write="triton", add_rmsnorm_quant="triton", silu_quant="triton").resolve()
    exact = decode(load_model(path, torch.bfloat16))
    quantized = decode(fp8.quantize(load_model(path, torch.bfloat16), "mlp,attn"))
    fused = decode(fp8.quantize(load_model(path, torch.bfloat16, ops=lowered), "mlp,attn"))
    for got, plain, expected in zip(fused, quantized, exact):
        assert got.dtype == torch.bfloat16 and torch.equal(got, plain)
        assert 20 < sqnr_db(got, expected) < math.inf


def test_modes_need_bf16():
    fp8.check_mode("none", "float32")
    fp8.check_mode("mlp", "bfloat16")
    fp8.check_mode("mlp,attn", "bfloat16")
    for mode in ("mlp", "mlp,attn"):
        with pytest.raises(ConfigError, match=f"--fp8 {mode} needs --dtype bfloat16"):
            fp8.check_mode(mode, "float32")
    for mode in ("attention", "attn", "attn,mlp", "all"):
        with pytest.raises(ConfigError, match="fp8 must be one of 'none', 'mlp', 'mlp,attn'"):
            fp8.check_mode(mode, "bfloat16")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch._scaled_mm)")
@pytest.mark.parametrize("m,n,k,bias", [(2250, 6144, 1024, False), (2250, 1024, 3072, False), (37, 96, 128, False),
                                         (2250, 4096, 1024, True), (2250, 1024, 2048, False), (37, 96, 128, True)])
def test_scaled_mm_on_cuda_is_the_emulation(m, n, k, bias):
    """The CUDA path (rowwise `_scaled_mm`, then the bias if any) computes what the CPU's emulation
    does, up to the order of FP32 sums and the bf16 rounding of the output; W1's MLP, qkv and o shapes."""
    gen = torch.Generator(device="cuda").manual_seed(m)
    linear = torch.nn.Linear(k, n, bias=bias, device="cuda", dtype=torch.bfloat16)
    linear.weight.data = (torch.randn(n, k, device="cuda", generator=gen) / k ** 0.5).to(torch.bfloat16)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    quantized = fp8.FP8Linear(linear)
    got = quantized(x)
    x_q, x_scale = fp8.quantize_rows(x)
    emulated = fp8.emulated_scaled_mm(x_q, x_scale, quantized.weight_q, quantized.weight_scale, torch.bfloat16)
    if bias:
        emulated = emulated + linear.bias.detach()
    torch.testing.assert_close(got.float(), emulated.float(), atol=2e-2, rtol=1.6e-2)
    assert sqnr_db(got, F.linear(x, linear.weight, linear.bias)) > 24
