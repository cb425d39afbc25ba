"""The residual add + RMSNorm: the Triton kernel (RMSNorm's ADD path) against the torch reference,
the registered op, and the model with the op lowered against the model without.

The kernel tests run the real kernel: under TRITON_INTERPRET=1 on CPU tensors (the CPU lane), else
compiled on CUDA. No dots, so bf16 runs in the interpreter too."""

import dataclasses

import pytest
import torch

from boundgen.model.loader import load_model
from boundgen.ops import add_rmsnorm as op
from boundgen.ops.lowering import REFERENCE, OpLowering
from tests.ops.kernel_testing import KERNEL_DEVICE, call_targets, needs_compiled_kernel, needs_kernel
from tests.ops.test_rmsnorm import EPS, assert_matches_reference


def make_inputs(num_tokens, hidden, dtype, device="cpu", seed=0, delta_stride=None):
    """(x, delta, weight); delta may be a view with a wider row stride (a slice of a wider output)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=gen) * 3
    wide = torch.randn(num_tokens, delta_stride or hidden, generator=gen)
    weight = 1 + 0.1 * torch.randn(hidden, generator=gen)
    return (x.to(device=device, dtype=dtype), wide[:, :hidden].to(device=device, dtype=dtype),
            weight.to(device=device, dtype=dtype))


def check(x, delta, weight, **launch):
    h, y = op.launch(x, delta, weight, EPS, **launch)
    expected_h, _ = op.reference(x, delta, weight, EPS)
    assert torch.equal(h, expected_h), "the sum is rounded once, as torch's add"
    assert_matches_reference(y, h, weight)  # y is the RMSNorm of that sum (tests/ops/test_rmsnorm.py)


@needs_kernel
@pytest.mark.parametrize("num_tokens", [1, 37, 123])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_kernel_matches_reference(num_tokens, dtype):
    check(*make_inputs(num_tokens, 48, dtype, KERNEL_DEVICE))


@needs_kernel
@pytest.mark.parametrize("block_rows", [1, 4])
def test_kernel_block_shapes_and_a_strided_delta(block_rows):
    check(*make_inputs(13, 48, torch.bfloat16, KERNEL_DEVICE, delta_stride=80), block_rows=block_rows)


def test_launcher_rejects_bad_delta():
    x, delta, weight = make_inputs(5, 48, torch.float32)
    with pytest.raises(ValueError, match="delta must be like x"):
        op.launch(x, delta[:4], weight, EPS)
    with pytest.raises(ValueError, match="delta must be like x"):
        op.launch(x, delta.half(), weight, EPS)
    with pytest.raises(ValueError, match=r"x must be \[T, H\]"):
        op.launch(x.reshape(5, 3, 16), delta.reshape(5, 3, 16), weight[:16], EPS)


def test_registered_op_runs_reference_on_cpu():
    x, delta, weight = make_inputs(7, 48, torch.float32)
    h, y = torch.ops.boundgen.add_rmsnorm(x, delta, weight, EPS)
    expected = op.reference(x, delta, weight, EPS)
    assert torch.equal(h, expected[0]) and torch.equal(y, expected[1])
    assert op.IMPLEMENTATIONS["triton"] is op.add_rmsnorm and op.IMPLEMENTATIONS["separate"] is None


def _decode_logits(model, tokens):
    positions = torch.arange(tokens.shape[0])
    cu = torch.tensor([0, tokens.shape[0]], dtype=torch.int32)
    hidden, _ = model.prefill(tokens, positions, cu)
    return model.logits(hidden)


@pytest.mark.parametrize("checkpoint", ["tiny_qwen2_dir", "tiny_qwen3_dir"])
def test_model_with_the_fused_op_equals_the_model_without(checkpoint, request):
    """The lowering changes where the add happens, not what is computed: in FP32 the model's logits
    are identical with the registered op (its CPU kernel is the reference) and within rounding with
    the kernel itself (the interpreter here)."""
    path = request.getfixturevalue(checkpoint)
    tokens = torch.randint(0, 500, (11,), generator=torch.Generator().manual_seed(1))
    expected = _decode_logits(load_model(path), tokens)
    lowered = load_model(path, ops=OpLowering(add_rmsnorm="triton").resolve())
    assert torch.equal(_decode_logits(lowered, tokens), expected)
    if KERNEL_DEVICE is not None:
        ops = dataclasses.replace(REFERENCE.resolve(), add_rmsnorm=op.launch)
        kernel = _decode_logits(load_model(path, device=KERNEL_DEVICE, ops=ops), tokens.to(KERNEL_DEVICE))
        torch.testing.assert_close(kernel.cpu(), expected, atol=1e-4, rtol=0)


class _AddNorm(torch.nn.Module):
    def forward(self, x, delta, weight):
        return op.IMPLEMENTATIONS["triton"](x, delta, weight, EPS)


def test_op_survives_export_as_one_node_with_dynamic_tokens():
    x, delta, weight = make_inputs(9, 48, torch.float32)
    tokens = torch.export.Dim("T", min=2, max=4096)
    exported = torch.export.export(_AddNorm(), (x, delta, weight), dynamic_shapes=({0: tokens}, {0: tokens}, None))
    calls = call_targets(exported)
    assert calls.count(torch.ops.boundgen.add_rmsnorm.default) == 1
    x2, delta2, _ = make_inputs(37, 48, torch.float32, seed=3)
    for got, expected in zip(exported.module()(x2, delta2, weight), op.reference(x2, delta2, weight, EPS)):
        assert torch.equal(got, expected)


@pytest.mark.gpu
@needs_compiled_kernel
@pytest.mark.parametrize("num_tokens,hidden", [(2400, 1024), (100, 896), (9000, 1024)])
def test_gpu_qwen_shapes(num_tokens, hidden):
    check(*make_inputs(num_tokens, hidden, torch.bfloat16, "cuda"))
