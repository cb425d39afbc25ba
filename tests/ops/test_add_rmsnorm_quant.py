"""The residual add + RMSNorm + E4M3 rowwise quantization in one kernel (RMSNorm's kernel with its
ADD and QUANT paths) against the torch reference, the registered op, and an FP8 model with the op
lowered against the one without.

The kernel tests run the real kernel: under TRITON_INTERPRET=1 on CPU tensors (the CPU lane), else
compiled on CUDA."""

import pytest
import torch

from boundgen.ops import add_rmsnorm_quant as op
from boundgen.ops import silu_quant
from boundgen.ops.e4m3 import E4M3
from tests.ops.decode_testing import assert_fp8_prefill_unchanged
from tests.ops.kernel_testing import KERNEL_DEVICE, call_targets, needs_compiled_kernel, needs_kernel
from tests.ops.test_add_rmsnorm import make_inputs
from tests.ops.test_rmsnorm import EPS


def check(x, delta, weight, **launch):
    h, q, scale = op.launch(x, delta, weight, EPS, **launch)
    expected_h, expected_q, expected_scale = op.reference(x.cpu(), delta.cpu(), weight.cpu(), EPS)
    assert torch.equal(h.cpu(), expected_h), "the sum is rounded once, as torch's add"
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


def test_quantize_needs_a_residual_add():
    x, _, weight = make_inputs(3, 16, torch.float32)
    with pytest.raises(ValueError, match="quantize comes with a residual add"):
        op.rmsnorm.launch(x, weight, EPS, quantize=True)


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
    assert op.IMPLEMENTATIONS["triton"] is op.add_rmsnorm_quant and op.IMPLEMENTATIONS["separate"] is None


@pytest.mark.parametrize("checkpoint", ["tiny_qwen2_dir", "tiny_qwen3_dir"])
def test_fp8_model_scores_alike_with_the_op(checkpoint, request):
    assert_fp8_prefill_unchanged(request.getfixturevalue(checkpoint), {"add_rmsnorm_quant": op.launch})


def test_fp8_model_scores_alike_with_both_fused_quantizations(tiny_qwen3_dir):
    assert_fp8_prefill_unchanged(tiny_qwen3_dir, {"add_rmsnorm_quant": op.launch, "silu_quant": silu_quant.launch})


@pytest.mark.gpu
@needs_compiled_kernel
@pytest.mark.parametrize("num_tokens", [1, 2250])
def test_gpu_w1_shape(num_tokens):
    check(*make_inputs(num_tokens, 1024, torch.bfloat16, "cuda"))
