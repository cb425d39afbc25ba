"""SwiGLU + the down projection as split-K partial products: the Triton kernel against the torch
reference, the residual add + RMSNorm summing them, the registered op, and the model decoding with
the op lowered against the model without.

The kernel tests run the real kernel: under TRITON_INTERPRET=1 on CPU tensors (the CPU lane), else
compiled on CUDA. Under the interpreter the kernel's dots run in FP32 (its bf16 dots are wrong,
TOOLCHAIN.md) on the same bf16 operands, so only the order of FP32 sums differs from the reference.
"""

import pytest
import torch
import torch.nn.functional as F

from boundgen.ops import add_rmsnorm, silu_mul
from boundgen.ops import swiglu_down as op
from tests.ops.decode_testing import assert_decode_unchanged
from tests.ops.kernel_testing import KERNEL_DEVICE, call_targets, needs_compiled_kernel, needs_kernel
from tests.ops.test_rmsnorm import EPS, assert_matches_reference

SMALL = (16, 16, 16, 4, 2)  # BLOCK_M, BLOCK_N, BLOCK_K, warps, stages: many programs on tiny inputs


def make_inputs(num_rows, hidden, inter, dtype, device="cpu", seed=0, row_stride=None):
    """(x [T, 2I], weight [H, I]); x may be a view with a wider row stride."""
    gen = torch.Generator().manual_seed(seed)
    wide = torch.randn(num_rows, row_stride or 2 * inter, generator=gen)
    weight = torch.randn(hidden, inter, generator=gen) / inter ** 0.5
    return wide[:, :2 * inter].to(device=device, dtype=dtype), weight.to(device=device, dtype=dtype)


def assert_partials_match(got, x, weight, k_split):
    expected = op.reference(x.cpu(), weight.cpu(), k_split)
    assert got.dtype == torch.float32 and got.shape == expected.shape == (op.splits(weight.shape[1], k_split),
                                                                          x.shape[0], weight.shape[0])
    # FP32 sums of up to k_split products of order-1 values, in another order than the reference's
    torch.testing.assert_close(got.cpu(), expected, atol=2e-5 * k_split ** 0.5, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("num_rows,k_split,config", [(1, 64, SMALL), (37, 64, SMALL), (37, 32, SMALL),
                                                     (20, 512, (32, 32, 64, 4, 2))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_kernel_matches_reference(num_rows, k_split, config, dtype):
    x, weight = make_inputs(num_rows, 48, 136, dtype, KERNEL_DEVICE)  # I 136: the last split is partial
    assert_partials_match(op.launch(x, weight, k_split, config), x, weight, k_split)


@needs_kernel
def test_kernel_reads_a_strided_gate_up():
    x, weight = make_inputs(9, 32, 64, torch.bfloat16, KERNEL_DEVICE, row_stride=160)
    assert_partials_match(op.launch(x, weight, 32, SMALL), x, weight, 32)


def test_total_of_the_partials_is_the_down_projection():
    x, weight = make_inputs(7, 24, 100, torch.float32)
    partials = op.reference(x, weight, 32)
    assert partials.shape == (4, 7, 24)
    expected = F.linear(silu_mul.reference(x), weight)
    torch.testing.assert_close(op.total(partials, torch.float32), expected, atol=1e-5, rtol=1e-5)
    in_order = ((partials[0] + partials[1]) + partials[2]) + partials[3]
    assert torch.equal(op.total(partials, torch.float32), in_order)
    assert torch.equal(op.total(partials, torch.bfloat16), in_order.to(torch.bfloat16))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_add_rmsnorm_sums_the_partials(dtype):
    """The add + norm kernel's partials path: the sum in split order rounded as a GEMM's output,
    then the add rounded once, exactly as the reference; the norm as RMSNorm's."""
    gen = torch.Generator().manual_seed(5)
    partials = torch.randn(5, 11, 48, generator=gen).to(KERNEL_DEVICE)
    x = (3 * torch.randn(11, 48, generator=gen)).to(device=KERNEL_DEVICE, dtype=dtype)
    weight = (1 + 0.1 * torch.randn(48, generator=gen)).to(device=KERNEL_DEVICE, dtype=dtype)
    h, y = add_rmsnorm.launch(x, partials, weight, EPS, block_rows=4)
    expected_h, _ = add_rmsnorm.reference(x, partials, weight, EPS)
    assert torch.equal(h, expected_h)
    assert_matches_reference(y, h, weight)


def test_launchers_reject_bad_inputs():
    x, weight = make_inputs(5, 16, 32, torch.float32)
    with pytest.raises(ValueError, match=r"expected x \[T, 2I\]"):
        op.launch(x[:, :40], weight)
    with pytest.raises(ValueError, match="share one dtype"):
        op.launch(x, weight.half())
    with pytest.raises(ValueError, match="must be contiguous"):
        op.launch(x, weight.t().contiguous().t())
    with pytest.raises(ValueError, match="must be on one device"):
        op.launch(x, weight.to("meta"))
    with pytest.raises(ValueError, match="multiple of block_k"):
        op.launch(x, weight, 40, SMALL)
    h = torch.randn(5, 16)
    with pytest.raises(ValueError, match=r"partial products must be \[S, T, H\] float32"):
        add_rmsnorm.launch(h, torch.randn(2, 4, 16), torch.ones(16), EPS)
    with pytest.raises(ValueError, match=r"partial products must be \[S, T, H\] float32"):
        add_rmsnorm.launch(h, torch.randn(2, 5, 16).double(), torch.ones(16), EPS)


def test_registered_op_runs_the_reference_on_cpu_and_exports_as_one_node():
    class Tail(torch.nn.Module):
        def forward(self, x, weight):
            return torch.ops.boundgen.swiglu_down(x, weight)

    x, weight = make_inputs(6, 16, 600, torch.float32)  # I 600: two splits of the default K_SPLIT
    assert torch.equal(torch.ops.boundgen.swiglu_down(x, weight), op.reference(x, weight))
    rows = torch.export.Dim("T", min=2, max=4096)
    exported = torch.export.export(Tail(), (x, weight), dynamic_shapes=({0: rows}, None))
    calls = call_targets(exported)
    assert calls.count(torch.ops.boundgen.swiglu_down.default) == 1, calls
    x2, _ = make_inputs(13, 16, 600, torch.float32, seed=2)
    got = exported.module()(x2, weight)
    assert got.shape == (2, 13, 16) and torch.equal(got, op.reference(x2, weight))
    assert op.IMPLEMENTATIONS["triton"] is op.swiglu_down and op.IMPLEMENTATIONS["separate"] is None


@pytest.mark.parametrize("checkpoint", ["tiny_qwen2_dir", "tiny_qwen3_dir"])
def test_model_decodes_alike_with_the_op(checkpoint, request):
    assert_decode_unchanged(request.getfixturevalue(checkpoint), "swiglu_down", op.launch, exact=False)


@pytest.mark.gpu
@needs_compiled_kernel
@pytest.mark.parametrize("num_rows", [100, 800])
def test_gpu_w2_shapes(num_rows):
    """Qwen2.5-0.5B's MLP (H 896, I 4,864) at a decode step's rows, bf16, the default config."""
    x, weight = make_inputs(num_rows, 896, 4864, torch.bfloat16, "cuda")
    assert_partials_match(op.launch(x, weight), x, weight, op.K_SPLIT)
