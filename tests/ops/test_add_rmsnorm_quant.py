"""The residual add + RMSNorm + E4M3 rowwise quantization in one kernel (RMSNorm's kernel with its
ADD and QUANT paths), and without the add (the first layer's input norm, ops/rmsnorm_quant.py),
against the torch reference, the registered ops, and FP8 models (--fp8 mlp and mlp,attn) with the
op lowered against the ones without.

The kernel tests run the real kernel: under TRITON_INTERPRET=1 on CPU tensors (the CPU lane), else
compiled on CUDA."""

import pytest
import torch

from boundgen.ops import add_rmsnorm_quant as op
from boundgen.ops import rmsnorm_quant, silu_quant
from boundgen.ops.e4m3 import E4M3
from tests.ops.decode_testing import assert_fp8_prefill_unchanged
from tests.ops.kernel_testing import KERNEL_DEVICE, call_targets, needs_compiled_kernel, needs_kernel
from tests.ops.test_add_rmsnorm import make_inputs
from tests.ops.test_rmsnorm import EPS


def check(x, delta, weight, **launch):
    h, q, scale = op.launch(x, delta, weight, EPS, **launch)
    expected_h, expected_q, expected_scale = op.reference(x.cpu(), None if delta is None else delta.cpu(),
                                                          weight.cpu(), EPS)
    assert torch.equal(h.cpu(), expected_h), "the sum is rounded once, as torch's add (x itself without delta)"
    assert q.dtype == E4M3 and q.shape == x.shape and scale.shape == (x.shape[0], 1)
    # the norm may differ from the reference by an ulp of x's dtype where the FP32 rstd differs in
    # its last bit (ops/rmsnorm.py): the row's amax, and an E4M3 value, with it
    torch.testing.assert_close(scale.cpu(), expected_scale, rtol=1e-2, atol=0)
    same = (q.cpu().float() == expected_q.float()).float().mean()
    assert same >= 0.99, same
    dequantized = (q.cpu().float() * scale.cpu() - expected_q.float() * expected_scale).abs()
    assert (dequantized <= 33 * expected_scale).all()  # within an E4M3 ulp (32 at the top of the range)


@needs_kernel
@pytest.mark.parametrize("num_tokens", [1, 37, 123])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernel_matches_reference(num_tokens, dtype):
    check(*make_inputs(num_tokens, 48, dtype, KERNEL_DEVICE))


@needs_kernel
def test_kernel_block_shapes_and_a_strided_delta():
    check(*make_inputs(13, 48, torch.bfloat16, KERNEL_DEVICE, delta_stride=80), block_rows=4)


@needs_kernel
@pytest.mark.parametrize("num_tokens,block_rows", [(1, None), (37, None), (13, 4)])
def test_kernel_without_a_residual_add_matches_reference(num_tokens, block_rows):
    """The first layer's input norm (--fp8 mlp,attn): nothing to add, h is x itself."""
    x, _, weight = make_inputs(num_tokens, 48, torch.bfloat16, KERNEL_DEVICE)
    check(x, None, weight, block_rows=block_rows)
    h, _, _ = op.launch(x, None, weight, EPS)
    assert h is x


def test_quantize_needs_rows():
    x = torch.randn(3, 2, 16)
    with pytest.raises(ValueError, match=r"rmsnorm_quant: x must be \[T, H\]"):
        op.rmsnorm.launch(x, torch.ones(16), EPS, quantize=True)


def test_registered_op_runs_the_reference_on_cpu_and_exports_as_one_node():
    class AddNormQuant(torch.nn.Module):
        def forward(self, x, delta, weight):
            return torch.ops.boundgen.add_rmsnorm_quant(x, delta, weight, EPS)

    x, delta, weight = make_inputs(7, 48, torch.bfloat16)
    for got, expected in zip(torch.ops.boundgen.add_rmsnorm_quant(x, delta, weight, EPS),
                             op.reference(x, delta, weight, EPS)):
        assert torch.equal(got.float(), expected.float())
    tokens = torch.export.Dim("T", min=2, max=4096)
    exported = torch.export.export(AddNormQuant(), (x, delta, weight), dynamic_shapes=({0: tokens}, {0: tokens}, None))
    calls = call_targets(exported)
    assert calls.count(torch.ops.boundgen.add_rmsnorm_quant.default) == 1, calls
    assert op.IMPLEMENTATIONS["triton"] is op.fused and op.IMPLEMENTATIONS["separate"] is None


def test_the_lowering_without_a_residual_add_calls_rmsnorm_quant_as_one_node():
    """`fused` with delta None: h is x, (q, scale) from the registered rmsnorm_quant (the reference
    on CPU), which exports as one node; with a delta, the add_rmsnorm_quant op."""
    class NormQuant(torch.nn.Module):
        def forward(self, x, weight):
            return op.fused(x, None, weight, EPS)[1:]

    x, delta, weight = make_inputs(7, 48, torch.bfloat16)
    h, q, scale = op.fused(x, None, weight, EPS)
    expected_q, expected_scale = rmsnorm_quant.reference(x, weight, EPS)
    assert h is x and torch.equal(q.float(), expected_q.float()) and torch.equal(scale, expected_scale)
    for got, expected in zip(op.fused(x, delta, weight, EPS), op.reference(x, delta, weight, EPS)):
        assert torch.equal(got.float(), expected.float())
    tokens = torch.export.Dim("T", min=2, max=4096)
    exported = torch.export.export(NormQuant(), (x, weight), dynamic_shapes=({0: tokens}, None))
    calls = call_targets(exported)
    assert calls.count(torch.ops.boundgen.rmsnorm_quant.default) == 1, calls


@pytest.mark.parametrize("mode", ["mlp", "mlp,attn"])
@pytest.mark.parametrize("checkpoint", ["tiny_qwen2_dir", "tiny_qwen3_dir"])
def test_fp8_model_scores_alike_with_the_op(checkpoint, mode, request):
    assert_fp8_prefill_unchanged(request.getfixturevalue(checkpoint), {"add_rmsnorm_quant": op.launch}, mode)


@pytest.mark.parametrize("mode", ["mlp", "mlp,attn"])
def test_fp8_model_scores_alike_with_both_fused_quantizations(tiny_qwen3_dir, mode):
    assert_fp8_prefill_unchanged(tiny_qwen3_dir, {"add_rmsnorm_quant": op.launch, "silu_quant": silu_quant.launch},
                                 mode)


@pytest.mark.gpu
@needs_compiled_kernel
@pytest.mark.parametrize("num_tokens", [1, 2250])
def test_gpu_w1_shape(num_tokens):
    x, delta, weight = make_inputs(num_tokens, 1024, torch.bfloat16, "cuda")
    check(x, delta, weight)
    check(x, None, weight)
