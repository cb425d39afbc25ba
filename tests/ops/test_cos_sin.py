"""cos_sin: the Triton kernel against the torch reference (ops/rope.py `cos_sin`), the registered op,
and the model computing its cos / sin with it.

The kernel tests run the real kernel: under TRITON_INTERPRET=1 on CPU tensors (the CPU lane;
tests/conftest.py sets the variable), else compiled on CUDA. Under the interpreter cos / sin are
numpy's, which may differ from torch's in the last FP32 bit: FP32 within a few ulp, bf16 / fp16
within one ulp (a value next to a rounding boundary), nearly all equal. On the GPU the kernel calls
what Inductor's compile of the reference calls: equal to it bit for bit.
"""

import pytest
import torch

from boundgen.ops import cos_sin as op
from boundgen.ops import rope
from tests.ops.decode_testing import assert_decode_unchanged
from tests.ops.kernel_testing import KERNEL_DEVICE, call_targets, needs_compiled_kernel, needs_kernel
from tests.ops.ulp import ulp_distance


def make_positions(num_rows, device="cpu", dtype=torch.int64, seed=0, high=4096):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, (num_rows,), generator=gen).to(device=device, dtype=dtype)


def assert_close_to(got, expected):
    assert got.dtype == expected.dtype and got.shape == expected.shape and got.is_contiguous()
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, expected, atol=2e-6, rtol=0)
    else:
        ulps = ulp_distance(got, expected)
        assert ulps.max() <= 1 and (ulps > 0).float().mean() < 0.01, (ulps.max(), (ulps > 0).float().mean())


@needs_kernel
@pytest.mark.parametrize("num_rows,block_t", [(1, 8), (37, 8), (37, 4), (100, 16)])
@pytest.mark.parametrize("head_dim", [16, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_kernel_matches_reference(num_rows, block_t, head_dim, dtype):
    positions = make_positions(num_rows, KERNEL_DEVICE)
    inv_freq = rope.inv_freq(head_dim, 1e6).to(KERNEL_DEVICE)
    got = op.launch(positions, inv_freq, dtype, block_t)
    for g, e in zip(got, op.reference(positions, inv_freq, dtype)):
        assert_close_to(g, e)


@needs_kernel
def test_kernel_takes_int32_positions():
    positions = make_positions(9, KERNEL_DEVICE)
    inv_freq = rope.inv_freq(16, 1e4).to(KERNEL_DEVICE)
    for a, b in zip(op.launch(positions.int(), inv_freq, torch.float32), op.launch(positions, inv_freq, torch.float32)):
        assert torch.equal(a, b)


def test_launcher_rejects_bad_inputs():
    positions, inv_freq = make_positions(4), rope.inv_freq(16, 1e4)
    with pytest.raises(ValueError, match=r"expected positions \[T\] int32 or int64"):
        op.launch(positions.float(), inv_freq, torch.bfloat16)
    with pytest.raises(ValueError, match=r"expected positions \[T\] int32 or int64"):
        op.launch(positions[None], inv_freq, torch.bfloat16)
    with pytest.raises(ValueError, match=r"expected inv_freq \[D/2\] float32 with D/2 a power of two"):
        op.launch(positions, inv_freq[:6], torch.bfloat16)
    with pytest.raises(ValueError, match=r"expected inv_freq \[D/2\] float32"):
        op.launch(positions, inv_freq.double(), torch.bfloat16)
    with pytest.raises(ValueError, match="dtype must be bfloat16, float16 or float32"):
        op.launch(positions, inv_freq, torch.int8)
    with pytest.raises(ValueError, match="must be on one device"):
        op.launch(positions, inv_freq.to("meta"), torch.bfloat16)


def test_op_exports_as_one_node_and_runs_the_reference_on_cpu():
    class Tables(torch.nn.Module):
        def forward(self, positions, inv_freq):
            return torch.ops.boundgen.cos_sin(positions, inv_freq, torch.bfloat16)

    positions, inv_freq = make_positions(12), rope.inv_freq(64, 1e6)
    rows = torch.export.Dim("T", min=1, max=4096)
    exported = torch.export.export(Tables(), (positions, inv_freq), dynamic_shapes=({0: rows}, None))
    calls = call_targets(exported)
    assert calls.count(torch.ops.boundgen.cos_sin.default) == 1, calls
    other = make_positions(33, seed=1)
    for got, expected in zip(exported.module()(other, inv_freq), op.reference(other, inv_freq, torch.bfloat16)):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("checkpoint", ["tiny_qwen2_dir", "tiny_qwen3_dir"])
def test_model_with_the_op_matches_the_model_without(checkpoint, request):
    """The model's cos / sin go through the lowering: prefill and decode steps with the registered op
    (its CPU kernel is the reference) are identical to those without; with the kernel itself (the
    interpreter) within FP32 rounding."""
    assert_decode_unchanged(request.getfixturevalue(checkpoint), "cos_sin", op.launch)


# ---------------------------------------------------------------------------------------------
# GPU: the kernel is what Inductor computes for the reference, and within an ulp of eager torch.

@pytest.mark.gpu
@needs_compiled_kernel
@pytest.mark.parametrize("num_rows,head_dim", [(100, 64), (800, 64), (2250, 128), (9000, 128)])
def test_gpu_matches_inductor_bit_for_bit(num_rows, head_dim):
    positions = make_positions(num_rows, "cuda", high=4096)
    inv_freq = rope.inv_freq(head_dim, 1e6).cuda()
    got = op.launch(positions, inv_freq, torch.bfloat16)
    compiled = torch.compile(op.reference, dynamic=False)(positions, inv_freq, torch.bfloat16)
    eager = op.reference(positions, inv_freq, torch.bfloat16)
    for g, c, e in zip(got, compiled, eager):
        assert torch.equal(g, c), ulp_distance(g, c).max()
        assert ulp_distance(g, e).max() <= 1
