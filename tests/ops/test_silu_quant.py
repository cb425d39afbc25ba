"""SwiGLU + E4M3 rowwise quantization in one kernel: against the torch reference (silu_mul, then
e4m3.quantize_rows), the E4M3 rounding the interpreter needs, the registered op, and an FP8 model
with the op lowered against the one without.

The kernel tests run the real kernel: under TRITON_INTERPRET=1 on CPU tensors (the CPU lane), else
compiled on CUDA."""

import pytest
import torch

from boundgen.ops import silu_quant as op
from boundgen.ops.e4m3 import E4M3, E4M3_MAX
from tests.ops.decode_testing import assert_fp8_prefill_unchanged
from tests.ops.kernel_testing import KERNEL_DEVICE, call_targets, needs_compiled_kernel, needs_kernel


def make_x(num_rows, inter, dtype, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_rows, 2 * inter, generator=gen) * torch.logspace(-2, 2, num_rows)[:, None]
    x[0, :inter] = 0  # a row whose activation is all zero: a finite scale, zeros out
    return x.to(device=device, dtype=dtype)


def assert_matches_reference(q, scale, x):
    expected_q, expected_scale = op.reference(x.cpu())
    assert q.dtype == E4M3 and scale.dtype == torch.float32 and scale.shape == (x.shape[0], 1)
    # equal but where the kernel's exp differs from torch's in its last FP32 bit (silu_mul.py):
    # a bf16 product, and with it the row's amax, may then move by an ulp; in FP32 (no rounding
    # of the product) the amax's last bit often does
    if x.dtype == torch.float32:
        torch.testing.assert_close(scale.cpu(), expected_scale, rtol=1e-6, atol=0)
    else:
        assert (scale.cpu() == expected_scale).float().mean() >= 0.9
    same = q.cpu().float() == expected_q.float()
    assert same.float().mean() >= (0.99 if x.dtype == torch.float32 else 0.999), same.float().mean()
    dequantized = (q.cpu().float() * scale.cpu() - expected_q.float() * expected_scale).abs()
    assert (dequantized <= expected_scale * 33).all()  # an E4M3 ulp at most (32 at the top of the range)


@needs_kernel
@pytest.mark.parametrize("num_rows,inter,block_t", [(1, 16, None), (37, 44, None), (123, 40, None), (7, 40, 4),
                                                    (12, 96, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_kernel_matches_reference(num_rows, inter, block_t, dtype):
    """One part (I 16) or two (44: 32 + 16, 4 padded columns; 40, 96: 32 + 8, 64 + 32), the default
    rows a program or a few, a partial last block."""
    x = make_x(num_rows, inter, dtype, KERNEL_DEVICE)
    assert_matches_reference(*op.launch(x, block_t), x)


@needs_kernel
def test_kernel_reads_a_strided_gate_up():
    wide = make_x(6, 48, torch.bfloat16, KERNEL_DEVICE)
    x = wide[:, :64]  # gate 32 and up 32 of a wider row
    assert x.stride(0) == 96
    assert_matches_reference(*op.launch(x), x)


@needs_kernel
def test_e4m3_rounding_on_the_grid_equals_torchs_cast():
    """The FP32 rounding onto the E4M3 grid that the CPU lane applies before its cast (the
    interpreter's own cast errs where rounding carries into the exponent) equals torch's cast, ties
    and subnormals included."""
    gen = torch.Generator().manual_seed(3)
    values = torch.cat([torch.randn(2000, generator=gen) * torch.logspace(-4, 2.6, 2000),
                        torch.tensor([0.0, 448.0, -448.0, 2 ** -9, 3 * 2 ** -10, 0.0546875, 15.5, 17.0, 240.0])])
    values = values.clamp(-E4M3_MAX, E4M3_MAX)
    x = torch.zeros(1, 2 * len(values))
    # silu(g) * u: g large makes silu(g) = g exactly in FP32, so choose the activation through up
    x[0, :len(values)] = 30.0
    x[0, len(values):] = values / 30.0
    q, scale = op.launch(x.to(KERNEL_DEVICE))
    expected_q, expected_scale = op.reference(x)
    assert torch.equal(scale.cpu(), expected_scale)
    assert torch.equal(q.cpu().float(), expected_q.float())


def test_a_row_splits_into_two_power_of_two_parts():
    assert op.parts(3072) == (2048, 1024) and op.parts(4864) == (4096, 1024)
    assert op.parts(16) == (16, 0) and op.parts(44) == (32, 16)
    assert op.default_config(3072) == (1, 4)


def test_launcher_rejects_bad_inputs():
    with pytest.raises(ValueError, match=r"expected x \[T, 2I\]"):
        op.launch(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="must be bfloat16, float16 or float32"):
        op.launch(torch.zeros(3, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="must be contiguous"):
        op.launch(torch.zeros(8, 6).t())


def test_registered_op_runs_the_reference_on_cpu_and_exports_as_one_node():
    class Quant(torch.nn.Module):
        def forward(self, x):
            return torch.ops.boundgen.silu_quant(x)

    x = make_x(5, 32, torch.bfloat16)
    for got, expected in zip(torch.ops.boundgen.silu_quant(x), op.reference(x)):
        assert torch.equal(got.float(), expected.float())
    rows = torch.export.Dim("T", min=2, max=4096)
    exported = torch.export.export(Quant(), (x,), dynamic_shapes=({0: rows},))
    calls = call_targets(exported)
    assert calls.count(torch.ops.boundgen.silu_quant.default) == 1, calls
    assert op.IMPLEMENTATIONS["triton"] is op.silu_quant and op.IMPLEMENTATIONS["separate"] is None


@pytest.mark.parametrize("checkpoint", ["tiny_qwen2_dir", "tiny_qwen3_dir"])
def test_fp8_model_scores_alike_with_the_op(checkpoint, request):
    assert_fp8_prefill_unchanged(request.getfixturevalue(checkpoint), {"silu_quant": op.launch})


@pytest.mark.gpu
@needs_compiled_kernel
@pytest.mark.parametrize("num_rows", [1, 2250])
def test_gpu_w1_shape(num_rows):
    """Qwen3-0.6B's gate/up output (I 3,072), bf16, the default config."""
    x = make_x(num_rows, 3072, torch.bfloat16, "cuda")
    assert_matches_reference(*op.launch(x), x)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_gpus_fast_divisions_stay_within_the_reference(dtype):
    """The GPU's default (approximate silu division, the row's reciprocal scale) differs from the
    reference by an ulp at times, never more."""
    x = make_x(12, 96, dtype, KERNEL_DEVICE, seed=4)
    assert_matches_reference(*op.launch(x, ieee_div=False), x)
